"""Helpers shared by the tests: tiny variant configs and checks, clean interpreters, scripts run as child processes."""
