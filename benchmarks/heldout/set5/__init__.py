"""A fifth set of held-out trainer families for ``benchmarks/parity/parity_diagnosis.py --set set5``.

Written by an outsider to the diagnosis code, after public code (each module's docstring names it),
with the interface of ``benchmarks/heldout/set3/``: per family a correct distributed training loop
``train(world_size, bug=None, variant=None)``, its correct one-device loop ``reference(world_size)``,
``STEPS``, the correct variants it runs (``CORRECT``: variant name -> world sizes) and its bugs
(``BUGS``: name -> one line). A bug is a flag of ``train`` only; the reference never changes. A family
may also hold ``SHARDS``, the ``shards=`` keyword a hand-sharded tensor-parallel loop needs (passed by
the runner only to a plugin whose ``assert_same_training`` accepts it). ``rubric.py`` holds, per bug,
the first cause expected, written and committed before any run of the plugin.
"""
FAMILIES = ("tp_mlp", "tp_attn", "tp_fused", "moe_ep", "amp_timm", "val_plateau", "onecycle_ls")
