package api

// SiteRequest is an operator's signed declaration (tool.svc.sites.add) or
// removal (tool.svc.sites.remove) of a site (docs/sites.md). A declaration
// carries only the public halves of the keys the site made for itself.
type SiteRequest struct {
	Site string `json:"site"`
	// UserKey is the public nkey of the user of the site's leaf-link
	// credentials; SigningKey the site's public signing key (prefix N).
	UserKey    string `json:"user_key,omitempty"`
	SigningKey string `json:"signing_key,omitempty"`
	By         string `json:"by,omitempty"`
}

// SiteAdded answers a declaration: the user JWT of the site's credentials
// (to go with the seed the site kept) and the hub's public files its
// bundle holds, by name (hops.pub, seal.pub).
type SiteAdded struct {
	Site  string            `json:"site"`
	JWT   string            `json:"jwt"`
	Files map[string]string `json:"files"`
	// Consumers says whether the hub made the site's consumers.
	Consumers bool `json:"consumers"`
}

// SiteRemoved answers a removal: how many of the site's leaf links the hub
// cut.
type SiteRemoved struct {
	Site     string `json:"site"`
	LinksCut int    `json:"links_cut"`
}
