"""Offline derender of generation logs (``derender-worker batch``): input/output formats
(``formats``), atomic output commit and part files (``commit``), stream-chunk records
(``streams``), the local multi-process engine (``runner``) and the Ray Data transform
(``ray_engine``, extra ``derender-worker[ray]``)."""
