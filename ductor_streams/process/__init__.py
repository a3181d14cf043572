"""Process wiring: the ``ductor-streams`` command and what each of its processes
(``serve``, ``workers``, ``dev``, ``doctor``, ``migrate``) starts, in order. The top
layer: nothing else in the package imports it (docs/architecture.md)."""
