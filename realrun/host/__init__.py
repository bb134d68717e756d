"""What the host machine does to real runs, measured: how far apart two CPUs are for a cache
line, what a write costs on lines another CPU copied last, what two meeting writes lose
(``probe``, on ``_cpuprobe.c`` where it was built), and the OS scheduler's time slice and load
balancer (``timeslice``). Light to import: the write-meeting probe's own processes start from
here without the runner."""
