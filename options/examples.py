"""A worked example: a breakfast-making option library (shown in the README)."""

from gyre_ma.options import OptionLibrary, TaskGraph

graph = TaskGraph.from_spec({
    "goals": ["serve"],
    "milestones": {
        "get_eggs":   {"duration": 20, "description": "eggs are on the counter"},
        "get_bread":  {"duration": 15},
        "boil_water": {"duration": 30},
        "buy_coffee": {"duration": 60},
        "fry_eggs":   {"requires": ["get_eggs"], "duration": 40},
        "make_toast": {"requires": ["get_bread"], "duration": 25},
        "hot_drink":  {"any_of": [["boil_water", "buy_coffee"]], "duration": 5},
        "serve":      {"requires": ["fry_eggs", "make_toast", "hot_drink"], "reward": 5.0},
    },
})
library = OptionLibrary("breakfast", graph)

def walk(ctx):  # a scripted sub-policy: one primitive action per call
    return 1 + ctx.steps % 4

def cook(ctx):
    return 5

def rested(ctx):  # `done` predicate of the repeatable / upkeep options
    return ctx.steps >= 3

for milestone in ("get_eggs", "get_bread", "buy_coffee"):
    library.option(f"fetch_{milestone}", milestone=milestone, max_steps=80)(walk)
for milestone in ("boil_water", "fry_eggs", "make_toast", "hot_drink", "serve"):
    library.option(milestone, milestone=milestone, max_steps=60)(cook)
library.option("tidy_up", done=rested, max_steps=10)(walk)
# every other field by keyword too: initiation=, failure=, repeatable=, exclusive=, features=,
# description= (a predicate is a function of ctx, features one of the observation)

def breakfast() -> OptionLibrary:
    return library.validate()
