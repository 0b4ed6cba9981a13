"""One reader per server: the files are read and judged once, and every serving process loads only what passed.

:mod:`.reader` (the reader process, started by the process that starts the workers), :mod:`.judging` (what it does
each interval), :mod:`.published` (the publication: versions in kubelet's atomic layout, the reader's figures),
:mod:`.subscription` (a serving process's side: what its reloader reads instead of the files).
"""
