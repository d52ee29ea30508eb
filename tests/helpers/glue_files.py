"""GLUE files written in the original GLUE layout (header, column order, label spelling), two rows per file."""

from __future__ import annotations

from pathlib import Path

from hfzoo.data.glue import GLUE_TASKS

# Two rows per file, written exactly in the original GLUE layout (header, column order, label spelling).
# Each row: (texts in the hub's column order, TSV label, expected hub label).
LAYOUTS = {
    "cola": dict(header=None, row=lambda t, lab: ["gj04", lab, "*" if lab == "0" else "", t[0]],
                 rows=[(("They drank the pub.",), "0", 0), (("He said \"hello.",), "1", 1)]),
    "sst2": dict(header=["sentence", "label"], row=lambda t, lab: [t[0], lab],
                 rows=[(("a charming journey . ",), "1", 1), (("\" bleak",), "0", 0)]),
    "mrpc": dict(header=["\ufeffQuality", "#1 ID", "#2 ID", "#1 String", "#2 String"],
                 row=lambda t, lab: [lab, "1355540", "1355592", t[0], t[1]],
                 rows=[(("He said it.", "\" It was said ."), "1", 1), (("A b.", "C d."), "0", 0)]),
    "stsb": dict(header=["index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1",
                         "sentence2", "score"],
                 row=lambda t, lab: ["0", "main-captions", "MSRvid", "2012test", "0001", "none", "none", t[0], t[1], lab],
                 rows=[(("A man is dancing.", "A man dances."), "5.000", 5.0),
                       (("A cat.", "A dog."), "1.53333333333333", 1.53333333333333)]),
    "qqp": dict(header=["id", "qid1", "qid2", "question1", "question2", "is_duplicate"],
                row=lambda t, lab: ["1", "2", "3", t[0], t[1], lab],
                rows=[(("How do I cook?", "How to cook?"), "1", 1), (("Why?", "What?"), "0", 0)]),
    "mnli": dict(header=["index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse",
                         "sentence1_parse", "sentence2_parse", "sentence1", "sentence2", "label1", "gold_label"],
                 row=lambda t, lab: ["0", "31193", "31193n", "government", "( ( x ) )", "( y )", "(ROOT x)",
                                     "(ROOT y)", t[0], t[1], lab, lab],
                 rows=[(("Conceptually cream skimming.", "Product and geography."), "neutral", 1),
                       (("You know.", "You don't know."), "contradiction", 2),
                       (("It is.", "It is true."), "entailment", 0)]),
    "qnli": dict(header=["index", "question", "sentence", "label"], row=lambda t, lab: ["0", t[0], t[1], lab],
                 rows=[(("What came?", "The constitution came."), "entailment", 0),
                       (("Where?", "Nowhere."), "not_entailment", 1)]),
    "rte": dict(header=["index", "sentence1", "sentence2", "label"], row=lambda t, lab: ["0", t[0], t[1], lab],
                rows=[(("Dana died.", "Dana had an accident."), "not_entailment", 1),
                      (("It rains.", "Water falls."), "entailment", 0)]),
    "wnli": dict(header=["index", "sentence1", "sentence2", "label"], row=lambda t, lab: ["0", t[0], t[1], lab],
                 rows=[(("The drain is clogged.", "The hair is."), "0", 0), (("Jane knocked.", "Susan."), "1", 1)]),
}  # fmt: skip


def write_tsv(path: Path, task: str, rows=None, header=None) -> Path:
    layout = LAYOUTS[task]
    header = layout["header"] if header is None else header
    lines = ["\t".join(header)] if header else []
    lines += ["\t".join(layout["row"](texts, label)) for texts, label, _ in (rows or layout["rows"])]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def write_glue_dir(root: Path, task: str) -> Path:
    spec = GLUE_TASKS[task]
    write_tsv(root / spec.folder / spec.train_file, task)
    for name in spec.validation_files.values():
        write_tsv(root / spec.folder / name, task)
    return root
