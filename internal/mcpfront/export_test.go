package mcpfront

// Sessions is the number of sessions the front end holds.
func (f *Front) Sessions() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.sessions)
}
