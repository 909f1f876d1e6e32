"""The program that asks the target's own vLLM, run by the server's Python (`python -`).

It imports `vllm.config.speculative` without loading a model and prints one JSON line after
`MARKER`: vLLM's version, its speculative methods, config keys and closed choices, the levels
of its per-request metrics option, whether its CPU sampler refuses synthetic acceptance, and
the side changes per method read from its own `vllm/config/vllm.py`; for the shape target, the
architectures its model registry serves and the strategies of its MoE routing simulation.
vllm.py → `ask_vllm` runs it, `parse_facts` reads the line.
"""

MARKER = "pytest-specdecode-vllm-facts:"  # the snippet's last line prints it, then the JSON

# Runs in the target's Python (any 3.8+ and any vLLM since SpeculativeConfig exists); prints
# one marked JSON line. vLLM logs to stdout, so only the marked line counts.
SNIPPET = r"""
import json, sys
out = {"python": sys.version.split()[0]}
try:
    import dataclasses, enum, inspect, types, typing
    import vllm
    out["version"] = str(getattr(vllm, "__version__", "unknown"))
    try:
        from vllm.config.speculative import SpeculativeConfig
        out["module"] = "vllm.config.speculative"
    except ImportError:
        from vllm.config import SpeculativeConfig
        out["module"] = "vllm.config"
    UNIONS = {typing.Union, getattr(types, "UnionType", typing.Union)}

    def leaves(tp, acc):
        origin = typing.get_origin(tp)
        if origin is typing.Annotated:
            args = typing.get_args(tp)
            if any(type(m).__name__ == "SkipValidation" for m in args[1:]):
                acc.append("internal")
            else:
                leaves(args[0], acc)
        elif origin in UNIONS:
            for arg in typing.get_args(tp):
                leaves(arg, acc)
        elif origin is typing.Literal:
            acc.extend(("literal", a) for a in typing.get_args(tp))
        else:
            acc.append(tp)
        return acc

    def kind_of(tp):
        kinds, choices, open_str = set(), [], False
        for leaf in leaves(tp, []):
            if leaf == "internal":
                return "internal", None
            if isinstance(leaf, tuple):
                choices.append(leaf[1])
                kinds.add("str" if isinstance(leaf[1], str) else "any")
                continue
            if leaf is type(None):
                continue
            o = typing.get_origin(leaf) or leaf
            if o is bool:
                kinds.add("bool")
            elif o is int:
                kinds.add("int")
            elif o is float:
                kinds.add("float")
            elif o is str:
                kinds.add("str")
                open_str = True
            elif isinstance(o, type) and issubclass(o, enum.Enum):
                kinds.add("str")
                open_str = True
            elif isinstance(o, type) and issubclass(o, (list, tuple, set, frozenset)):
                kinds.add("list")
            elif isinstance(o, type) and issubclass(o, dict):
                kinds.add("dict")
            elif isinstance(o, type) and (
                dataclasses.is_dataclass(o) or hasattr(o, "__pydantic_fields__")
            ):
                kinds.add("object")
            else:
                kinds.add("any")
        if "object" in kinds:
            return "object", None
        if kinds == {"int", "float"}:
            kinds = {"float"}
        kind = kinds.pop() if len(kinds) == 1 else "any"
        closed = kind == "str" and not open_str and choices
        return kind, (sorted(map(str, choices)) if closed else None)

    try:
        hints = typing.get_type_hints(SpeculativeConfig, include_extras=True)
    except Exception:
        hints = {}
    if dataclasses.is_dataclass(SpeculativeConfig):
        fields = [
            (f.name, hints.get(f.name, f.type))
            for f in dataclasses.fields(SpeculativeConfig)
            if f.init
        ]
    else:
        params = inspect.signature(SpeculativeConfig.__init__).parameters.values()
        fields = [(p.name, p.annotation) for p in params if p.name != "self"]
    keys, choices, internal = {}, {}, []
    for name, tp in fields:
        if isinstance(tp, str) or tp is inspect.Parameter.empty:
            keys[name] = "any"
            continue
        kind, closed = kind_of(tp)
        if kind in ("internal", "object"):
            internal.append(name)
            continue
        keys[name] = kind
        if closed:
            choices[name] = closed
    out["keys"] = keys
    out["choices"] = choices
    out["internal"] = internal
    out["methods"] = choices.pop("method", None)
    try:  # the server option of per-request speculative metrics, with its levels, if it has it
        from vllm.engine.arg_utils import EngineArgs
        names = {f.name: f for f in dataclasses.fields(EngineArgs)}
        found = names.get("per_request_spec_decode_metrics")
        if found is not None:
            tp = found.type  # EngineArgs' own hints do not resolve (forward references)
            if isinstance(tp, str):
                from vllm.config.observability import ObservabilityConfig
                tp = typing.get_type_hints(ObservabilityConfig).get(found.name, tp)
            levels = [] if isinstance(tp, str) else leaves(tp, [])
            out["per_request_spec_decode_metrics"] = sorted(
                str(leaf[1]) for leaf in levels if isinstance(leaf, tuple)
            )
    except Exception as exc:
        out["per_request_note"] = "%s: %s" % (type(exc).__name__, exc)
    try:  # synthetic acceptance (the break-even map): vLLM's CPU sampler refuses it
        from vllm.platforms import current_platform
        if current_platform.is_cpu():
            from vllm.utils import cpu_triton_utils
            said = "Synthetic acceptance not supported with CPU sampling"
            if said in inspect.getsource(cpu_triton_utils):
                out["synthetic_note"] = (
                    "vLLM %s on a CPU: its sampler asserts '%s' "
                    "(vllm/utils/cpu_triton_utils.py) at the first speculative step"
                    % (out["version"], said)
                )
    except Exception:
        pass
    try:  # the side changes per method, from this vLLM's own vllm/config/vllm.py
        import ast
        import vllm.config.vllm as vc
        names = vars(vc)

        def flat(tp):
            found = []
            for arg in typing.get_args(tp):
                found.extend([arg] if isinstance(arg, str) else flat(arg))
            return found

        def compared(tree, ops):
            # the methods that `….method` is compared with by `ops` anywhere in `tree`
            found = []
            for n in ast.walk(tree):
                left = getattr(n, "left", None)
                if not isinstance(n, ast.Compare) or getattr(left, "attr", None) != "method":
                    continue
                for op, right in zip(n.ops, n.comparators):
                    if type(op).__name__ not in ops:
                        continue
                    items = getattr(right, "elts", [right])
                    found.extend(e.value for e in items
                                 if isinstance(e, ast.Constant) and isinstance(e.value, str))
                    if (isinstance(right, ast.Call) and getattr(right.func, "id", "") == "get_args"
                            and right.args and isinstance(right.args[0], ast.Name)):
                        found.extend(flat(names.get(right.args[0].id)))
            return sorted(set(found))

        def says(body, text):
            return any(isinstance(n, ast.Constant) and isinstance(n.value, str)
                       and text in n.value for stmt in body for n in ast.walk(stmt))

        rules = {"source": "vllm/config/vllm.py"}
        for node in ast.walk(ast.parse(inspect.getsource(vc))):
            if isinstance(node, ast.If) and says(node.body, "Async scheduling not supported with"):
                kept = compared(node.test, ("NotIn", "NotEq"))
                if kept:
                    rules["async_kept"] = kept
            if (isinstance(node, ast.FunctionDef)
                    and node.name == "_get_v2_model_runner_unsupported_features"):
                rules["v2_unsupported"] = compared(node, ("In", "Eq")) or None
        if "HAS_TRITON" in names:
            rules["triton"] = bool(names["HAS_TRITON"])
        try:  # a platform that turns async scheduling off at every start, the original's too
            from vllm.platforms import current_platform
            said = "scheduler_config.async_scheduling = False"
            if current_platform.is_cpu() and said in inspect.getsource(type(current_platform)):
                rules["async_never"] = (
                    "vLLM %s's CPU platform turns async scheduling off at every start "
                    "(vllm/platforms/cpu.py)" % out["version"]
                )
        except Exception:
            pass
        out["side_rules"] = rules
    except Exception as exc:
        out["side_rules"] = {"note": "%s: %s" % (type(exc).__name__, exc)}
    out["architectures"] = None  # the shape target: what this vLLM can serve, and balance
    out["moe_routing"] = None
    try:
        from vllm.model_executor.models import ModelRegistry
        out["architectures"] = sorted(ModelRegistry.get_supported_archs())
    except Exception as exc:
        out["shape_note"] = "its model registry: %s: %s" % (type(exc).__name__, exc)
    try:
        import vllm.envs as envs
        if "VLLM_MOE_ROUTING_SIMULATION_STRATEGY" not in getattr(envs, "environment_variables", {}):
            out["moe_routing"] = []
        else:
            try:
                from vllm.model_executor.layers.fused_moe.router import (
                    routing_simulator_router as rs)
            except ImportError:
                from vllm.model_executor.layers.fused_moe import routing_simulator as rs
            out["moe_routing"] = sorted(rs.RoutingSimulator._routing_strategies)
    except Exception as exc:
        out["shape_note"] = "its MoE routing simulation: %s: %s" % (type(exc).__name__, exc)
except Exception as exc:
    out["error"] = "%s: %s" % (type(exc).__name__, exc)
print("pytest-specdecode-vllm-facts:" + json.dumps(out))
"""
