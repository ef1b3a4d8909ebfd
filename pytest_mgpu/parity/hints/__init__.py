"""The likely causes of a divergence, each from its own evidence: hints read from the numbers of the
user's code (``numbers``), from what their loops were seen doing (``loops``), from what the optimizer
held and was told (``optimizer``); ``diagnose`` renders the tables and orders the causes."""
