"""Diagnosis from evidence: at the first step that diverges, the first phase of the step that
differs (``finding.PHASES``: the state before the step, the rows fed, the loss, the gradients, the
update), between ranks that should agree and against the reference, and how it differs (one rank
alone, a uniform factor, some modules, certain rows); then the cause that evidence points to.

One module per phase (``state``, ``inputs``, ``loss``, ``gradients``, ``update``), each returning
``Finding``s; one table of causes that reads them (``causes``); what the run is, without evidence of
where it differs, in ``possible``."""
