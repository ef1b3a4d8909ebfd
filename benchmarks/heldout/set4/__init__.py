"""A fourth set of held-out trainer families for ``benchmarks/parity/parity_diagnosis.py --set set4``:
training loops written with the high-level libraries' public APIs (Lightning Fabric and Trainer,
accelerate, transformers' Trainer, peft) and torch.compile with autocast and GradScaler.

Written by an outsider to the diagnosis code, after each library's public docs and examples (each
module's docstring names them), with the interface of ``benchmarks/heldout3``: per family a correct
distributed training loop ``train(world_size, bug=None, variant=None)``, its correct one-device loop
``reference(world_size)``, ``STEPS``, the correct variants it runs (``CORRECT``: variant name ->
world sizes) and its bugs (``BUGS``: name -> one line). A bug is a flag of ``train`` only; the
reference never changes. ``rubric.py`` holds, per bug, the first cause expected, written and
committed before any run of the plugin. ``check.py`` runs every case without the plugin.
"""
FAMILIES = ("fabric_vit", "pl_trainer", "accel_accum", "hf_trainer", "compile_amp", "peft_lora")
