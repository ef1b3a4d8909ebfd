"""A nineteenth set of held-out trainer families for ``benchmarks/parity/parity_diagnosis.py --set set19``.

Written by an outsider to the diagnosis code, after public code (each module's docstring names the
files it follows), with the interface of ``benchmarks/heldout/set18/``: per family a correct distributed
training loop ``train(world_size, bug=None, variant=None)``, its correct one-device loop
``reference(world_size)``, ``STEPS``, the correct variants (``CORRECT``: variant name -> world sizes) and
the bugs (``BUGS``: name -> one line). A bug is a flag of ``train`` only; the reference never changes.
``rubric.py`` holds, per bug, the first cause expected, written and committed before any run of the
plugin on this set.
"""
FAMILIES = ("megatron_seq_parallel", "gradcache_retrieval", "sac_ddp", "stylegan2_lazy_r1", "accel_plateau_val",
            "fabric_fp16_scaler")
