"""Helper for experiment 4, run as a child process so it has a timeout.

    python3 smallfiles.py create|stat|delete DIR COUNT SIZE

create: open, write SIZE bytes, close COUNT files; stat: stat them and check
the size; delete: unlink them. Prints the phase's wall time in seconds.
"""

import os
import sys
import time


def main():
    phase, d, count, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    names = [os.path.join(d, "small%05d.bin" % i) for i in range(count)]
    data = bytes((i * 7 + 3) & 0xFF for i in range(size))
    t0 = time.monotonic()
    if phase == "create":
        for n in names:
            with open(n, "wb") as f:
                f.write(data)
    elif phase == "stat":
        for n in names:
            st = os.stat(n)
            if st.st_size != size:
                sys.exit("%s has size %d, expected %d" % (n, st.st_size, size))
    elif phase == "delete":
        for n in names:
            os.unlink(n)
    else:
        sys.exit("unknown phase " + phase)
    print("%.6f" % (time.monotonic() - t0))


if __name__ == "__main__":
    main()
