"""The management HTTP API's recorded cases (see cases.py, runner.py, record.py)."""
