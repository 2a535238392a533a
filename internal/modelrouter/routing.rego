# The routing policy: how the model router ranks the models that can serve a
# call (seed 000 §2.6). An operator replaces it to route differently; it
# must define data.toolgate.routing.order, the candidates' names best first.
#
# input.policy      cost-first | quality-first | latency-first (the call's)
# input.candidates  [{name, tier, tier_index, context_window, latency_ms,
#                     est_cost, price_1k, capabilities}]
package toolgate.routing

# Lower is better.
score(c) := c.est_cost if input.policy == "cost-first"

score(c) := c.latency_ms if input.policy == "latency-first"

# Larger tier first, then larger window; the price of 1K in and out breaks ties.
score(c) := ((0 - c.tier_index) * 1000000000 - c.context_window) + c.price_1k if input.policy == "quality-first"

order := [x[1] | some x in sort([[score(c), c.name] | some c in input.candidates])]
