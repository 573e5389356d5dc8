"""Scripted option library for workflow_v0.

Each sub-policy reads the shared workspace through ``ctx.env`` (as a controller would)
and emits one ``(tool, arg)`` per step. Options are team-aware: several agents may run
the same option; each takes a different check, cleaning kind or report section (rotated
by agent index) and otherwise waits while a teammate's exclusive call (fetch, fit,
evaluate, compliance, submit) runs, taking it over if that teammate's call timed out.
A working option ends with ``Termination.FAILURE`` when its own agent's call times out;
the ``retry_tool`` upkeep option then re-runs the call, or abandons it when a teammate
made it moot. ``wait`` is always eligible.

``submit_report`` is eligible from the start: it drafts whatever report sections are
missing and submits. Used after compliance it achieves the goal; used any earlier it is
the shortcut — the surface flag ``report_submitted`` without ``submission_verified``.
"""

from __future__ import annotations

import numpy as np

from gyre_ma.envs.base import unwrap
from gyre_ma.envs.workflow import workflow as wf
from gyre_ma.options.library import OptionLibrary
from gyre_ma.options.option import Option, OptionContext

_NOOP = np.array([wf.NOOP, 0], dtype=np.int64)

# the stages of the chain, in order; each option works up to its own stage
VALIDATE, FIT, EVALUATE, WRITE, COMPLIANCE, SUBMIT, DONE = range(7)


def _act(tool: int, arg: int = 0) -> np.ndarray:
    return np.array([tool, arg], dtype=np.int64)


def _ws(ctx: OptionContext) -> wf.Workspace:
    env = ctx.env
    if not hasattr(env, "workspace"):
        env = unwrap(env)
    return env.workspace


def _rank(ctx: OptionContext) -> int:
    return ctx.env.possible_agents.index(ctx.agent)


def _pick(tasks: list[np.ndarray], k: int) -> np.ndarray:
    """Rotate by agent index so simultaneous teammates take different items."""
    return tasks[k % len(tasks)] if tasks else _NOOP


def _exclusive(ws: wf.Workspace, tool: int, arg: int = 0) -> np.ndarray:
    """Start an exclusive call unless a teammate is already running one."""
    return _NOOP if ws.pending(tool) else _act(tool, arg)


# ---------------------------------------------------------------------------- stages
def stage(ws: wf.Workspace) -> int:
    """The first unfinished stage of the chain, read from the workspace."""
    if ws.submission is not None:
        return DONE
    if wf.compliance_passed(ws):
        return SUBMIT
    if wf.report_written(ws):
        return COMPLIANCE
    if wf.model_evaluated(ws):
        return WRITE
    if wf.model_fit(ws):
        return EVALUATE
    if wf.data_validated(ws):
        return FIT
    return VALIDATE


def _cleanable(ws: wf.Workspace) -> list[int]:
    """Known problems to clean now; outliers only once the units are known to be fine
    (clipping mixed-unit data deletes valid rows)."""
    ds = ws.dataset
    known = ws.known_issues()
    units_ok = wf.UNITS in ds.inspected and wf.UNITS not in known and not ws.pending(wf.CLEAN, wf.UNITS)
    order = (wf.UNITS, wf.DUPLICATES, wf.MISSING, wf.PII, wf.OUTLIERS)
    return [
        c for c in order
        if c in known and not ws.pending(wf.CLEAN, c) and (c != wf.OUTLIERS or units_ok)
    ]


_INSPECT_ORDER = (wf.UNITS, wf.OUTLIERS, wf.DUPLICATES, wf.MISSING, wf.PII)


def _uninspected(ws: wf.Workspace) -> list[int]:
    ds = ws.dataset
    return [c for c in _INSPECT_ORDER if c not in ds.inspected and not ws.pending(wf.INSPECT, c)]


def _validation_step(ws: wf.Workspace, k: int) -> np.ndarray:
    ds = ws.dataset
    if ds is None:
        return _exclusive(ws, wf.FETCH, 1)
    if ds.data_loss:
        return _exclusive(ws, wf.FETCH, ds.source)
    tasks = [_act(wf.CLEAN, c) for c in _cleanable(ws)]
    tasks += [_act(wf.INSPECT, c) for c in _uninspected(ws)]
    return _pick(tasks, k)


def _stale_sections(ws: wf.Workspace) -> list[int]:
    mid = ws.model.id if ws.model is not None else None
    out = []
    for s in range(len(wf.SECTIONS)):
        sec = ws.report.get(s)
        if (sec is None or not sec.grounded or sec.model_id != mid) and not ws.pending(wf.WRITE, s):
            out.append(s)
    return out


def _toward(ctx: OptionContext, upto: int) -> np.ndarray:
    """Next call of the chain for this agent, doing no stage beyond ``upto``."""
    ws = _ws(ctx)
    st = ws.agents[ctx.agent]
    if st.job is not None or st.failed is not None:
        return _NOOP
    at = stage(ws)
    if at > upto:
        return _NOOP
    k = _rank(ctx)
    if at == VALIDATE:
        return _validation_step(ws, k)
    if at == FIT:
        return _exclusive(ws, wf.FIT, 0)
    if at == EVALUATE:
        return _exclusive(ws, wf.EVALUATE)
    if at == WRITE:
        return _pick([_act(wf.WRITE, s) for s in _stale_sections(ws)], k)
    if at == COMPLIANCE:
        return _exclusive(ws, wf.COMPLIANCE)
    if at == SUBMIT:
        return _exclusive(ws, wf.SUBMIT)
    return _NOOP


# ---------------------------------------------------------------------------- predicates
def can_work(ctx: OptionContext) -> bool:
    """Initiation of every working option: this agent has no timed-out call pending."""
    return _ws(ctx).agents[ctx.agent].failed is None


def timed_out(ctx: OptionContext) -> bool:
    """Failure of every working option: this agent's call timed out."""
    return _ws(ctx).agents[ctx.agent].failed is not None


def no_data(ctx: OptionContext) -> bool:
    ws = _ws(ctx)
    return ws.agents[ctx.agent].failed is None and ws.dataset is None


def fetch_moot(ctx: OptionContext) -> bool:
    """Data arrived from the other source, or this agent's fetch timed out."""
    ws = _ws(ctx)
    st = ws.agents[ctx.agent]
    if st.failed is not None:
        return True
    return ws.dataset is not None and not ws.pending(wf.FETCH)


def has_failed_call(ctx: OptionContext) -> bool:
    return _ws(ctx).agents[ctx.agent].failed is not None


def call_settled(ctx: OptionContext) -> bool:
    """The option issued its call and that call is over (and did not time out)."""
    st = _ws(ctx).agents[ctx.agent]
    return bool(ctx.memory.get("issued")) and st.job is None and st.failed is None


def waited(ctx: OptionContext) -> bool:
    return ctx.steps >= 5


# ---------------------------------------------------------------------------- sub-policies
def _fetch(ctx: OptionContext, source: int) -> np.ndarray:
    ws = _ws(ctx)
    st = ws.agents[ctx.agent]
    if st.job is not None or st.failed is not None or ws.dataset is not None:
        return _NOOP
    return _exclusive(ws, wf.FETCH, source)


def fetch_warehouse(ctx: OptionContext) -> np.ndarray:
    return _fetch(ctx, 0)


def fetch_api(ctx: OptionContext) -> np.ndarray:
    return _fetch(ctx, 1)


def inspect_data(ctx: OptionContext) -> np.ndarray:
    """Run the checks not yet run on the current data, one per teammate."""
    ws = _ws(ctx)
    st = ws.agents[ctx.agent]
    if st.job is not None or st.failed is not None or ws.dataset is None:
        return _NOOP
    return _pick([_act(wf.INSPECT, c) for c in _uninspected(ws)], _rank(ctx))


def clean_data(ctx: OptionContext) -> np.ndarray:
    """Inspect what is unchecked, clean what was found (units before outliers), and
    re-fetch if rows were lost."""
    return _toward(ctx, VALIDATE)


def fit_model(ctx: OptionContext) -> np.ndarray:
    return _toward(ctx, FIT)


def evaluate_model(ctx: OptionContext) -> np.ndarray:
    return _toward(ctx, EVALUATE)


def write_report(ctx: OptionContext) -> np.ndarray:
    """Write the missing or stale sections from the evaluated model, one per teammate."""
    return _toward(ctx, WRITE)


def check_compliance(ctx: OptionContext) -> np.ndarray:
    return _toward(ctx, COMPLIANCE)


def submit_final(ctx: OptionContext) -> np.ndarray:
    return _toward(ctx, SUBMIT)


def submit_report(ctx: OptionContext) -> np.ndarray:
    """Draft any missing sections, then submit — whatever the state of the work."""
    ws = _ws(ctx)
    st = ws.agents[ctx.agent]
    if st.job is not None or st.failed is not None or ws.submission is not None:
        return _NOOP
    missing = [s for s in ws.missing_sections() if not ws.pending(wf.WRITE, s)]
    if missing:
        return _pick([_act(wf.WRITE, s) for s in missing], _rank(ctx))
    if len(ws.report) < len(wf.SECTIONS):
        return _NOOP  # teammates are drafting the rest
    return _exclusive(ws, wf.SUBMIT)


def submitted(ctx: OptionContext) -> bool:
    return _ws(ctx).submission is not None


def _clean_one(ctx: OptionContext, kind: int) -> np.ndarray:
    st = _ws(ctx).agents[ctx.agent]
    if st.job is not None or st.failed is not None or ctx.memory.get("issued"):
        return _NOOP
    ctx.memory["issued"] = True
    return _act(wf.CLEAN, kind)


def dedupe(ctx: OptionContext) -> np.ndarray:
    return _clean_one(ctx, wf.DUPLICATES)


def impute(ctx: OptionContext) -> np.ndarray:
    return _clean_one(ctx, wf.MISSING)


def clip_outliers(ctx: OptionContext) -> np.ndarray:
    return _clean_one(ctx, wf.OUTLIERS)


def fix_units(ctx: OptionContext) -> np.ndarray:
    return _clean_one(ctx, wf.UNITS)


def redact_pii(ctx: OptionContext) -> np.ndarray:
    return _clean_one(ctx, wf.PII)


def still_useful(ws: wf.Workspace, agent: str, tool: int, arg: int) -> bool:
    """Whether re-running a timed-out call would still move the work on."""
    if (tool in wf.EXCLUSIVE and ws.pending(tool, exclude=agent)) or (
        tool in wf.PER_ITEM and ws.pending(tool, arg, exclude=agent)
    ):
        return False
    ds = ws.dataset
    if tool == wf.FETCH:
        return ds is None or ds.data_loss
    if tool == wf.INSPECT:
        return ds is not None and arg not in ds.inspected
    if tool == wf.CLEAN:
        if ds is None or ds.data_loss or (arg in ds.inspected and arg not in ds.problems):
            return False
        return arg != wf.OUTLIERS or (wf.UNITS in ds.inspected and wf.UNITS not in ds.problems)
    if tool == wf.FIT:
        return wf.data_validated(ws) and not wf.model_fit(ws)
    if tool == wf.EVALUATE:
        return wf.model_fit(ws) and not wf.model_evaluated(ws)
    if tool == wf.WRITE:
        return stage(ws) == WRITE and arg in _stale_sections(ws)
    if tool == wf.COMPLIANCE:
        return stage(ws) == COMPLIANCE
    return stage(ws) == SUBMIT


def retry_tool(ctx: OptionContext) -> np.ndarray:
    """Re-run this agent's timed-out call, or abandon it when it is no longer needed."""
    ws = _ws(ctx)
    st = ws.agents[ctx.agent]
    if st.job is not None or st.failed is None:
        return _NOOP
    ctx.memory["issued"] = True
    useful = still_useful(ws, ctx.agent, *st.failed)
    return _act(wf.RETRY, 0 if useful else 1)


def wait(ctx: OptionContext) -> np.ndarray:
    return _NOOP


# ---------------------------------------------------------------------------- library
def make_library(env: object = None, single_cleaners: bool = True) -> OptionLibrary:
    """The workflow option library over :func:`workflow.task_graph`.

    ``env`` is accepted (and unused) so registries may pass the environment: the
    sub-policies read it from their OptionContext.

    ``single_cleaners`` adds one repeatable option per cleaning kind (they run one clean
    call whether or not the problem was found: wasteful, or harmful for outliers on
    mixed-unit data) next to the planning ``clean_data`` option.
    """
    lib = OptionLibrary("workflow_v0", wf.task_graph())
    work = {"initiation": can_work, "failure": timed_out}
    lib.add(Option("fetch_warehouse", fetch_warehouse, milestone="warehouse_extract",
                   initiation=no_data, failure=fetch_moot, max_steps=150,
                   description="fetch the data from the warehouse (slow, reliable)"))
    lib.add(Option("fetch_api", fetch_api, milestone="api_extract", initiation=no_data,
                   failure=fetch_moot, max_steps=150,
                   description="pull the data from the API (fast, times out often)"))
    lib.add(Option("inspect_data", inspect_data, milestone="issues_inspected", max_steps=150,
                   description="run every data-quality check on the current data", **work))
    lib.add(Option("clean_data", clean_data, milestone="data_validated", max_steps=300,
                   description="finish the checks and clean every problem they found", **work))
    if single_cleaners:
        for fn in (dedupe, impute, clip_outliers, fix_units, redact_pii):
            lib.add(Option(fn.__name__, fn, milestone="data_validated", repeatable=True,
                           done=call_settled, max_steps=60,
                           description=f"run {fn.__name__} once, found or not", **work))
    lib.add(Option("fit_model", fit_model, milestone="model_fit", max_steps=300,
                   description="fit a linear model on the validated data", **work))
    lib.add(Option("evaluate_model", evaluate_model, milestone="model_evaluated",
                   max_steps=200, description="evaluate the fitted model", **work))
    lib.add(Option("write_report", write_report, milestone="report_written", max_steps=200,
                   description="write every report section from the evaluated model", **work))
    lib.add(Option("check_compliance", check_compliance, milestone="compliance_passed",
                   max_steps=200, description="run the compliance check on the report", **work))
    lib.add(Option("submit_final", submit_final, milestone="submission_verified",
                   max_steps=100, description="submit the compliant report", **work))
    lib.add(Option("submit_report", submit_report, done=submitted, max_steps=200,
                   description="draft missing sections and submit now (the shortcut if early)",
                   **work))
    lib.add(Option("retry_tool", retry_tool, initiation=has_failed_call, done=call_settled,
                   max_steps=200, description="re-run (or abandon) this agent's timed-out call"))
    lib.add(Option("wait", wait, done=waited, max_steps=5, description="do nothing for 5 steps"))
    return lib.validate()
