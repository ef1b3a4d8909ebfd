"""An eighteenth set of held-out trainer families for ``benchmarks/parity/parity_diagnosis.py --set set18``.

Written by an outsider to the diagnosis code, after public code (each module's docstring names the
files it follows), with the interface of ``benchmarks/heldout/set17/``: per family a correct distributed
training loop ``train(world_size, bug=None, variant=None)``, its correct one-device loop
``reference(world_size)``, ``STEPS``, the correct variants (``CORRECT``: variant name -> world sizes) and
the bugs (``BUGS``: name -> one line). A bug is a flag of ``train`` only; the reference never changes.
``rubric.py`` holds, per bug, the first cause expected, written and committed before any run of the
plugin on this set.
"""
FAMILIES = ("fabric_bf16_kd", "pseudo_label_eval", "mixtral_moe_aux", "partial_fc_margin", "nnunet_dice_ds",
            "yolo_nbs_warmup")
