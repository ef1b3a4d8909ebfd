"""Judging the steps (test process): the distance of two tensors (``distance``), the line a correct
run stays within (``tolerance``), nothing compared is not a pass (``vacuous``), and how each rank's
loss and parameters make the one-device run's (``layout``)."""
