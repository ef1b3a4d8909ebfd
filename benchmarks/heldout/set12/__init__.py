"""A twelfth set of held-out trainer families for ``benchmarks/parity/parity_diagnosis.py --set set12``.

Written by an outsider to the diagnosis code, after public code (each module's docstring names the
files it follows), with the interface of ``benchmarks/heldout/set9/``: per family a correct distributed
training loop ``train(world_size, bug=None, variant=None)``, its correct one-device loop
``reference(world_size)``, ``STEPS``, the correct variants (``CORRECT``: variant name -> world sizes) and
the bugs (``BUGS``: name -> one line). A bug is a flag of ``train`` only; the reference never changes.
A family may set ``BUG_WORLD`` (the world size its bugs run at; 2 where absent) and ``SHARDS`` (how its
hand-sharded tensors are put back together). ``rubric.py`` holds, per bug, the first cause expected,
written and committed before any run of the plugin on this set.
"""
FAMILIES = ("wgan_gp", "sam_ddp", "swa_bn", "lars_warmup", "amp_ckpt", "tp_dp_2d", "val_sched")
