"""General (task-agnostic) distillation: the data-parallel train step of a run's students (`step`), the
run (`trainer`), its defaults (`config`), the run's students by name, one or a family from one
teacher pass (`family`), ETD's extraction of a student from its teacher (`etd`) and Taylor
importance (`importance`), and the parameters an objective never trains (`untrained`)."""
