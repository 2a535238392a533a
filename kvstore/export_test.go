package kvstore

import "time"

// SetClock makes r read the time from now.
func (r *ModelStatsRecorder) SetClock(now func() time.Time) { r.now = now }
