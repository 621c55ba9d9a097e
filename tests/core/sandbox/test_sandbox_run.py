"""What a program sees and what comes back: output, echo, tracebacks, stdin, exit codes."""

from __future__ import annotations

from rstar2_agent.sandbox import ExecRequest, Status
from rstar2_agent.sandbox.templates import BASE, DEFAULT_TEMPLATES, FULL, NUMPY, TemplateRouter


async def test_prints_and_echoes_the_final_expression(sandbox):
    r = await sandbox.run("x = 6\nprint('x is', x)\nx * 7")
    assert r.status == Status.OK and r.exit_code == 0
    assert r.stdout == "x is 6\n42\n"


async def test_final_none_expression_is_not_echoed(sandbox):
    r = await sandbox.run("print('a')\nNone")
    assert r.stdout == "a\n"


async def test_numpy_and_sympy_are_preloaded_and_work(sandbox):
    r = await sandbox.run("import numpy as np, sympy as sp\nx = sp.symbols('x')\n"
                          "print(sp.solve(x**2 - 4, x), int(np.arange(5).sum()))")
    assert r.ok, r.stderr
    assert r.stdout == "[-2, 2] 10\n"


async def test_exception_traceback_points_at_the_user_line_only(sandbox):
    r = await sandbox.run("def f(a):\n    return a / 0\n\nf(1)")
    assert r.status == Status.ERROR and r.exit_code == 1
    assert 'File "main.py", line 4' in r.stderr and 'File "main.py", line 2, in f' in r.stderr
    assert "ZeroDivisionError: division by zero" in r.stderr
    assert "runner" not in r.stderr and "/opt/rstar2" not in r.stderr


async def test_syntax_error_is_reported_with_its_line(sandbox):
    r = await sandbox.run("x = 1\ny = (\n")
    assert r.status == Status.ERROR
    assert "SyntaxError" in r.stderr and "line 2" in r.stderr


async def test_stdin_is_the_program_input(sandbox):
    r = await sandbox.run("a, b = map(int, input().split())\nprint(a + b)", stdin="2 40\n")
    assert r.stdout == "42\n"


async def test_sys_exit_code_is_kept(sandbox):
    r = await sandbox.run("import sys\nprint('bye')\nsys.exit(3)")
    assert r.status == Status.ERROR and r.exit_code == 3 and r.stdout == "bye\n"
    assert (await sandbox.run("import sys; sys.exit(0)")).status == Status.OK


async def test_exit_and_quit_work_as_in_a_normal_interpreter(sandbox):
    """The runner starts with -S, which leaves out site's exit() and quit(); programs call them."""
    r = await sandbox.run("print('a')\nexit()\nprint('b')")
    assert r.status == Status.OK and r.stdout == "a\n"
    r = await sandbox.run("quit(4)")
    assert r.status == Status.ERROR and r.exit_code == 4


async def test_each_call_starts_from_a_clean_state(sandbox):
    await sandbox.run("import math\nmath.pi = 3\nopen('state.txt', 'w').write('x')")
    for _ in range(4):  # reaches both workers
        r = await sandbox.run("import math, os\nprint(math.pi, os.listdir('.'), 'leak' in globals())")
        assert r.stdout == "3.141592653589793 [] False\n"


async def test_batch_keeps_order(sandbox):
    results = await sandbox.run_batch([ExecRequest(f"print({i} * 2)") for i in range(20)])
    assert [r.stdout for r in results] == [f"{i * 2}\n" for i in range(20)]


async def test_programs_go_to_the_smallest_template_that_preloaded_what_they_name(sandbox):
    probe = "import sys\nprint(['sym' + 'py' in sys.modules, 'num' + 'py' in sys.modules])"
    plain = await sandbox.run(probe)
    with_numpy = await sandbox.run("import numpy\n" + probe)
    with_sympy = await sandbox.run("import sympy\n" + probe)
    assert plain.stdout == "[False, False]\n"
    assert with_numpy.stdout == "[False, True]\n"
    assert with_sympy.stdout == "[True, True]\n"
    assert len({plain.backend, with_numpy.backend, with_sympy.backend}) == 3


def test_router_picks_the_smallest_covering_template():
    router = TemplateRouter(DEFAULT_TEMPLATES)
    assert router.pick("print(1)") == BASE
    assert router.pick("import numpy as np") == NUMPY
    assert router.pick("from sympy import *\nimport numpy") == FULL
    assert router.pick("import mpmath") == FULL
    assert TemplateRouter(((),)).pick("import sympy") == ()
