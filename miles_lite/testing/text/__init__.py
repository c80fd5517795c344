"""The stand-in SGLang text engine (``/generate``, ``/v1/chat/completions``, control endpoints).

Modules by concern: :mod:`.config` (how it behaves), :mod:`.policy` and :mod:`.model`
(what it answers: a script, or a tiny random-weight model), :mod:`.state` (what its
parts share), :mod:`.stats` (what it has seen), :mod:`.validate` (the 400s SGLang
gives), :mod:`.scheduler` (batch slots, pauses, aborts, token pacing), :mod:`.decode`
(the token loop and its stops), :mod:`.generate` (``/generate`` answers and streams),
:mod:`.chat`, :mod:`.chat_answers`, :mod:`.templates` and :mod:`.tools` (the OpenAI
endpoint), :mod:`.control` (control and info endpoints), :mod:`.server` (routes and
serving), :mod:`.engine` (:class:`~miles_lite.testing.TextStandInEngine`, their
composition), :mod:`.process` (the engine in child processes), :mod:`.shapes` (comparing
answers by shape). The public names are re-exported by :mod:`miles_lite.testing`.
"""
