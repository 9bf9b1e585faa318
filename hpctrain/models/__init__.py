"""Model plug-ins: the registry (``build_task``) and the task contract the runtime trains through."""
