"""GLUE's official metrics (Wang et al. 2019, Table 1) as a local `evaluate` metric module.

The same computations and names as `evaluate`'s hub metric `glue` (which loads its code from the hub):
Matthews correlation (CoLA), accuracy (SST-2, MNLI matched/mismatched, QNLI, RTE, WNLI, HANS),
accuracy and binary F1 of the positive class (MRPC, QQP), Pearson and Spearman correlation (STS-B).
Self-contained (no relative imports), because `evaluate.load` copies the file to its module cache.
"""

import datasets
import evaluate
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import f1_score, matthews_corrcoef

_CITATION = """\
@inproceedings{wang2019glue,
  title={{GLUE}: A Multi-Task Benchmark and Analysis Platform for Natural Language Understanding},
  author={Wang, Alex and Singh, Amanpreet and Michael, Julian and Hill, Felix and Levy, Omer and Bowman, Samuel R.},
  booktitle={International Conference on Learning Representations},
  year={2019}
}
"""

_DESCRIPTION = "GLUE's official metric(s) for one task; choose the task as the config name."

_KWARGS_DESCRIPTION = """
Args:
    predictions: predicted class ids (int), or predicted scores (float) for stsb.
    references: gold class ids (int), or gold scores (float) for stsb.
Returns: a dict with, depending on the task:
    matthews_correlation (cola), accuracy (sst2, mnli*, qnli, rte, wnli, hans),
    accuracy and f1 (mrpc, qqp), pearson and spearmanr (stsb); floats.
"""

TASKS = ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "mnli_matched", "mnli_mismatched", "qnli", "rte",
         "wnli", "hans")  # fmt: skip


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Glue(evaluate.Metric):
    """GLUE metric for the task given as `config_name`."""

    def _info(self):
        if self.config_name not in TASKS:
            raise KeyError(f"unknown GLUE task {self.config_name!r}; choose one of {list(TASKS)}")
        value = datasets.Value("float32" if self.config_name == "stsb" else "int64")
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"predictions": value, "references": value}),
            format="numpy",
        )

    def _compute(self, predictions, references):
        if self.config_name == "cola":
            return {"matthews_correlation": float(matthews_corrcoef(references, predictions))}
        if self.config_name == "stsb":
            return {
                "pearson": float(pearsonr(predictions, references)[0]),
                "spearmanr": float(spearmanr(predictions, references)[0]),
            }
        accuracy = float((predictions == references).mean())
        if self.config_name in ("mrpc", "qqp"):
            return {"accuracy": accuracy, "f1": float(f1_score(y_true=references, y_pred=predictions))}
        return {"accuracy": accuracy}
