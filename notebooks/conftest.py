"""nbval over the notebooks: when a cell fails because this run wrote to stderr and the stored
notebook did not, print what it wrote. nbval itself only says "Unexpected output fields from
running code: {'stderr'}"; pytest shows the printed text under "Captured stdout call".

(Why: CI runs failed that way by turns, in figure cells of 05 and then 04, and passed on rerun.
This printed the cause: matplotlib's warning that placing a loc="best" legend took over a second,
which depends on the machine's load; ``plotting.save_figure`` now silences it.)
"""

try:
    from nbval.plugin import IPyNbCell
except ImportError:  # plain pytest over this folder, without the [dev] extra: nothing to patch
    IPyNbCell = None


def stderr_text(outputs) -> str:
    return "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream" and o.get("name") == "stderr")


if IPyNbCell is not None:
    _compare_outputs = IPyNbCell.compare_outputs

    def _compare_outputs_and_show_new_stderr(self, test, ref, skip_compare=None):
        same = _compare_outputs(self, test, ref, skip_compare)
        if not same and stderr_text(test) and not stderr_text(ref):
            print(f"stderr of this run, absent from the stored notebook:\n{stderr_text(test)}")
        return same

    IPyNbCell.compare_outputs = _compare_outputs_and_show_new_stderr
