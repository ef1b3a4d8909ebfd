"""A sixteenth set of held-out trainer families for ``benchmarks/parity/parity_diagnosis.py --set set16``.

Written by an outsider to the diagnosis code, after public code (each module's docstring names the
files it follows), with the interface of ``benchmarks/heldout/set15/``: per family a correct distributed
training loop ``train(world_size, bug=None, variant=None)``, its correct one-device loop
``reference(world_size)``, ``STEPS``, the correct variants (``CORRECT``: variant name -> world sizes) and
the bugs (``BUGS``: name -> one line). A bug is a flag of ``train`` only; the reference never changes.
``rubric.py`` holds, per bug, the first cause expected, written and committed before any run of the
plugin on this set.
"""
FAMILIES = ("hf_bert_accum", "megatron_tp", "fabric_gpt_accum", "timm_vit_ema", "moe_top1_capacity", "pipeline_gpipe")
