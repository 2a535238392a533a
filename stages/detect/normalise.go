package detect

// normalise returns the forms of s that differ from it and are worth
// scanning too, and whether there are any.
func normalise(s string) ([]string, bool) {
	var out []string
	if d, ok := percentDecoded(s); ok {
		out = append(out, d)
	}
	return out, len(out) > 0
}
