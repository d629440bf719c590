"""The second worked example, tabular and not MNIST (pipelines/tabular_example): the bar a distributed run must
reach against the example's single-process baseline.

The example runs through kfp.local in module mode (tests/test_module_mode.py, against the same runner in one
process) and, as its TFJob, in containers of its own image in `make e2e` (tests/test_e2e.py, against the program
run as one process in that image, with a lost pod on the way).
"""

# How far below the single-process baseline's test AUC the 2-worker run may land (the same data, epochs and global
# batch per worker; on 143 held-out tumours one misordered pair moves the AUC by about 0.0001).
AUC_MARGIN = 0.01

# The epochs and global batch of both runs, the baseline's and the distributed one's.
EPOCHS, GLOBAL_BATCH = "60", 128
