"""The simulated ``libnvidia-ml.so.1``: C source, its builder, and what it reads.

``nvml.c`` is built with the machine's C compiler into a cache folder named by a hash of
the source and the build flags, so an edited source is rebuilt and an unchanged one never
is. :func:`hardware_text` renders a profile's GPUs and their faults into the line format
the library parses at every ``nvmlInit`` (documented at the top of ``nvml.c``).
"""
