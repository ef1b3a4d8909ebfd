"""A twentieth set of held-out trainer families for ``benchmarks/parity/parity_diagnosis.py --set set20``.

Written by an outsider to the diagnosis code, after public code (each module's docstring names the
files it follows), with the interface of ``benchmarks/heldout/set19/``: per family a correct distributed
training loop ``train(world_size, bug=None, variant=None)``, its correct one-device loop
``reference(world_size)``, ``STEPS``, the correct variants (``CORRECT``: variant name -> world sizes) and
the bugs (``BUGS``: name -> one line). A bug is a flag of ``train`` only; the reference never changes.
``rubric.py`` holds, per bug, the first cause expected, written and committed before any run of the
plugin on this set.
"""
FAMILIES = ("timm_cosine_accum", "expert_choice_ep", "llama_tp_hand", "rdrop_fp16_ddp", "memory_bank_nce",
            "hf_gpt2_poly_accum")
