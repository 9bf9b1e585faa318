"""Reports of runs: collect a run's files, draw them, write one self-contained page or serve it live."""
