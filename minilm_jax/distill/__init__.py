"""General (task-agnostic) distillation: the data-parallel train step (`step`), the run (`trainer`),
its defaults (`config`), a family of students from one teacher pass (`family`), ETD's extraction of
a student from its teacher (`etd`) and Taylor importance (`importance`), and the parameters an
objective never trains (`untrained`)."""
