"""Runnable examples of hadar_train on scikit-learn's digits dataset
(Debian's python3-sklearn ships it; no download):

- ``python3 -m hadar_train.examples.single``: one GPU;
- ``python3 -m hadar_train.examples.ddp``: DistributedDataParallel, one
  process per GPU, as the hadar sidecar starts a unit's workers;
- ``python3 -m hadar_train.examples.hadare``: a HadarE copy.

Each runs outside hadar too (``--steps``), trains the same small MLP, and
prints ``final steps_done=... test_accuracy=...``."""
