"""Recording a step (inside ranks and the reference's process): what a loop's step was, seen through
torch's global hooks (``watch``), the user's ``log`` (``recorder``) or every ``optimizer.step()``
(``step_recorder``), what each rank holds on its mesh (``mesh``), and how one side's loop runs with
its float64 and same-precision companions (``loops``, ``loop_companions``)."""
