"""The stand-in SGLang diffusion engine (``/rollout/generate`` with synthetic samples).

Modules by concern: :mod:`.config` (how it behaves), :mod:`.faults` (runtime fault
switches), :mod:`.stats` (what it has seen), :mod:`.request` (a request checked as SGLang
checks it), :mod:`.trajectories` (the deterministic samples), :mod:`.encode` and
:mod:`.body` (answer bodies in either wire form), :mod:`.info` (the info endpoints'
documents), :mod:`.generate` (the ``/rollout/generate`` endpoint), :mod:`.engine` (the
server: life, routes, control endpoints), :mod:`.process` (the engine in child
processes). The public names are re-exported by :mod:`miles_lite.testing`.
"""
