"""Held-out trainer families for ``benchmarks/parity/parity_diagnosis.py``.

Each family module holds a correct distributed training loop ``train(world_size, bug=None,
variant=None)``, its correct one-device loop ``reference(world_size)``, the correct variants it runs
(``CORRECT``: variant name -> world sizes) and its bugs (``BUGS``: name -> one line). A bug is a flag
of ``train`` only; the reference never changes. ``rubric.py`` holds, per bug, the first cause
expected, written before any run.
"""
FAMILIES = ("lm_ddp", "fsdp2_accum", "zero_ddp", "comm_hooks", "fsdp1", "tp_plan", "dino_ema", "moe_ep",
            "ddp_nosync")
