"""Reading the log of `megatron train` strictly: iteration lines and validation lines.

What it is: the one parser the end-to-end tests share. It returns each iteration line's fields
keyed by iteration number, and it fails (AssertionError, naming the line) on anything that looks
like a piece of such a line but is not a whole one: a line cut in two by a launcher's output
forwarding, a line printed twice, an iteration that was expected and is missing. Tests then pair
runs by iteration number, never by position, so a lost line can never shift one curve against
another. What it is not: a parser of the start-up dump or of the timing report.

Field values are kept as the printed text (tests that compare "every printed digit" compare
strings); number() converts one.
"""
import re

# One whole iteration line: " [date] iteration N/ T | name: value | ... | name: value |".
ITERATION_RE = re.compile(r"^ \[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] iteration +(\d+)/ *(\d+) \|"
                          r"((?: [a-zA-Z][a-zA-Z0-9 ()/_-]*: [^|]*\|)+)$")
# One whole validation line: " validation loss at PLACE | name value: x | name PPL: y | ".
# " validation loss at ..." or, with --multiple-validation-sets, " validation-<set> loss at ...".
VALIDATION_RE = re.compile(
    r"^ validation(?:-(\S+))? loss at (.+?) \|((?: [a-zA-Z][a-zA-Z0-9 _-]*: [^|]*\|)+) $")
# Text that only iteration or validation lines print: a line holding any of it must be whole.
FRAGMENT_RE = re.compile(r"\] iteration +\d|iteration +\d+/ *\d+ \||consumed samples:|"
                         r"elapsed time per iteration|lm loss:|grad norm:|number of skipped "
                         r"iterations|number of nan iterations|validation loss at|lm loss value:|"
                         r"lm loss PPL:")


def _fields(text):
    """' a: 1 | b: 2 |' -> {"a": "1", "b": "2"} (values stripped)."""
    out = {}
    for part in text.split("|")[:-1]:
        name, sep, value = part.partition(": ")
        if not sep:
            raise AssertionError(f"malformed field {part!r}")
        out[name.strip()] = value.strip()
    return out


def iteration_lines(stdout, expect=None):
    """{iteration: {field: printed value}} for every iteration line of `stdout`.

    Fails on a cut or malformed line, on an iteration printed twice, and, when `expect` (an
    iterable of iteration numbers) is given, unless exactly those iterations were printed."""
    got = {}
    for n, line in enumerate(stdout.splitlines(), 1):
        m = ITERATION_RE.match(line)
        if m is None:
            if FRAGMENT_RE.search(line) and not VALIDATION_RE.match(line):
                raise AssertionError(f"log line {n} is a cut or malformed iteration or "
                                     f"validation line: {line!r}")
            continue
        it = int(m[1])
        if it in got:
            raise AssertionError(f"log line {n}: iteration {it} printed twice")
        fields = _fields(m[3])
        fields["train iters"] = m[2]
        got[it] = fields
    if expect is not None:
        want = set(expect)
        missing, extra = sorted(want - set(got)), sorted(set(got) - want)
        if missing or extra:
            raise AssertionError(f"iteration lines: missing {missing[:20]}"
                                 f"{' ...' if len(missing) > 20 else ''}, unexpected "
                                 f"{extra[:20]} ({len(got)} lines found)")
    return got


def validation_lines(stdout):
    """[(place, {field: printed value})] for every validation line, in order ("iteration 50",
    "iteration 200 on validation set", ...). Fails on a cut iteration or validation line."""
    iteration_lines(stdout)  # the fragment check covers validation lines too
    return [(place, fields) for _, place, fields in validation_set_lines(stdout)]


def validation_set_lines(stdout):
    """[(set, place, {field: printed value})] for every validation line, in order; set is None
    for a plain " validation loss" line, the index of " validation-<index> loss" lines (an int),
    the name of " validation-<name> loss" lines (--validation-set-names)."""
    iteration_lines(stdout)
    out = []
    for line in stdout.splitlines():
        m = VALIDATION_RE.match(line)
        if m:
            name = m[1]
            out.append((int(name) if name is not None and name.isdigit() else name, m[2],
                        _fields(m[3])))
    return out


def number(fields, name):
    """The field as a float, None when the line left it out (a skipped iteration has no loss)."""
    value = fields.get(name)
    return None if value is None else float(value)


def series(lines, name):
    """[number(lines[it], name) for it in sorted order]: one field over a run."""
    return [number(lines[it], name) for it in sorted(lines)]


def loss_curve(stdout, iters):
    """{iteration: (lm loss, grad norm)} as floats for iterations 1..iters, every one printed
    (iters None: whichever iterations were printed)."""
    lines = iteration_lines(stdout, range(1, iters + 1) if iters else None)
    return {it: (number(f, "lm loss"), number(f, "grad norm")) for it, f in lines.items()}


def validation_losses(stdout):
    """[(place, lm loss value)] of every validation line, in order."""
    return [(where, number(f, "lm loss value")) for where, f in validation_lines(stdout)]


def curves(stdout, keys, first, last):
    """{iteration: {key: number}} of iterations first..last; fails unless each has its line."""
    lines = {it: f for it, f in iteration_lines(stdout).items() if first <= it <= last}
    if sorted(lines) != list(range(first, last + 1)):
        raise AssertionError(f"iterations {first}..{last} expected, got {sorted(lines)}:\n"
                             f"{stdout[-2000:]}")
    return {it: {k: number(f, k) for k in keys} for it, f in lines.items()}


def assert_same_curves(test, got, want, name, rel=1e-5):
    """Every value of `want` ({iteration: {key: number}}) within `rel` of `got`'s; the grad norm,
    printed with 3 decimals, with one unit of its last digit more."""
    for it, w in want.items():
        for key, value in w.items():
            slack = 2e-3 if key == "grad norm" else 0.0
            test.assertAlmostEqual(got[it][key], value, delta=rel * abs(value) + slack,
                                   msg=f"{name}: {key} at iteration {it}")
