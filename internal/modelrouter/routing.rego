# The routing policy: how the model router ranks the models that can serve a
# call (seed 000 §2.6). An operator replaces it to route differently; it
# must define data.toolgate.routing.order, the candidates' names best first.
#
# input.policy      cost-first | quality-first | latency-first (the call's)
# input.candidates  [{name, tier, tier_index, context_window, latency_ms,
#                     typical_latency_ms, est_cost, price_1k, capabilities,
#                     observed?}]
#
# latency_ms is the observed median latency when the cluster has seen enough
# recent calls of the model (observed is then set: {calls, success_rate,
# p50_ms, p95_ms}), else the catalogue's typical_latency_ms.
package toolgate.routing

# Lower is better.
score(c) := c.est_cost if input.policy == "cost-first"

score(c) := c.latency_ms if input.policy == "latency-first"

# Larger tier first, then larger window; the price of 1K in and out breaks ties.
score(c) := ((0 - c.tier_index) * 1000000000 - c.context_window) + c.price_1k if input.policy == "quality-first"

# A model that fails more than one call in five lately goes after the
# others; among equals, the one that succeeds more often goes first.
order := [x[3] | some x in sort([[demoted, score(c), 0 - rate, c.name] |
	some c in input.candidates
	rate := object.get(c, ["observed", "success_rate"], 1)
	demoted := to_number(rate < 0.8)
])]
