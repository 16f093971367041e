"""Launch: record a whole program without changing it (``commdebug run``, the start-up hook),
and write each rank's dump however the program ends."""
