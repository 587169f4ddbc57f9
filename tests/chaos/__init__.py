"""The chaos suite (short versions of bench/chaos_report.py) and the crash-race repro."""
