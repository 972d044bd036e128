"""Renderers: pure functions from a :class:`~omni_pd.launch.spec.LaunchPlan` to files.

Each module renders one target (:mod:`omni_pd.render.scripts`: one runnable shell script
per host, as srtctl renders sbatch scripts). A renderer returns ``{relative path: text}``
and writes nothing; ``omni-pd render --to DIR`` checks the result and writes it
atomically, never over an input.
"""
