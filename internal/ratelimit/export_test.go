package ratelimit

// Leases is how many leases l holds.
func Leases(l *Limiter) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.leases)
}
