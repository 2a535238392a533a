# toolgate's shipped document policy: who may read which document of a
# call's document_context. The execute stage evaluates
# data.toolgate.documents.decision once per document, before fetching it,
# with this input:
#
#   input.agent_did     the calling agent
#   input.tenant        the tenant of the call
#   input.tool_id       the tool the documents are handed to
#   input.source        the document source's name
#   input.source_tenants  the tenants the source is declared for ([] = all)
#   input.document_id   the document
#   input.version       the version asked for ("" = the latest)
#   input.access_mode   "read" (the only mode a call has)
#
# and expects {"allow": bool, "reasons": [string]}. Anything else is a
# denial. Replace it by pushing a bundle with a module of package
# toolgate.documents (`toolgate policy push DIR`).
package toolgate.documents

default decision := {"allow": false, "reasons": ["no rule allowed the document"]}

decision := {"allow": true, "reasons": []} if count(deny) == 0

decision := {"allow": false, "reasons": sort(deny)} if count(deny) > 0

deny contains msg if {
	count(input.source_tenants) > 0
	not input.tenant in input.source_tenants
	msg := sprintf("source %s does not serve tenant %s", [input.source, input.tenant])
}

deny contains msg if {
	input.access_mode != "read"
	msg := sprintf("access mode %s is not allowed", [input.access_mode])
}
