"""A second set of held-out trainer families for ``benchmarks/parity/parity_diagnosis.py --set set2``.

Written by an outsider to the diagnosis code, after public code (each module's docstring names it),
with the same interface as ``benchmarks/heldout/set1``: per family a correct distributed training loop
``train(world_size, bug=None, variant=None)``, its correct one-device loop ``reference(world_size)``,
``STEPS``, the correct variants it runs (``CORRECT``: variant name -> world sizes) and its bugs
(``BUGS``: name -> one line). A bug is a flag of ``train`` only; the reference never changes.
``rubric.py`` holds, per bug, the first cause expected, written and committed before any run.
"""
FAMILIES = ("cnn_bn", "gpt_accum", "fsdp1_tut", "fsdp2_mp", "tp_sp", "comm_hook_zero", "dino_teacher", "moe_top2")
