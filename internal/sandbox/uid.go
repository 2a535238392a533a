package sandbox

import (
	"math/rand/v2"
	"sync"
)

// When toolgate runs as root, each run gets a uid of its own from
// [UIDBase, UIDBase+uidCount). RLIMIT_NPROC counts every process and thread
// of a uid across the host, so runs sharing one uid (nobody) would share one
// process budget: a fork bomb, or the threads of a Node.js MCP server,
// would leave a concurrent tool unable to start. The uids belong to no
// account; files a tool writes into a read-write grant are owned by its uid.
const (
	UIDBase  = 1 << 30
	uidCount = 1 << 16
)

// uidPool hands out uids not in use by this process. Worker processes on
// one host start at random offsets; if two ever pick the same uid, the two
// runs only share a process budget, as they would under nobody.
type uidPool struct {
	mu   sync.Mutex
	next uint32
	used map[uint32]bool
}

var uids = &uidPool{next: rand.Uint32N(uidCount), used: map[uint32]bool{}}

func (p *uidPool) get() uint32 {
	p.mu.Lock()
	defer p.mu.Unlock()
	for range uidCount {
		id := p.next
		p.next = (p.next + 1) % uidCount
		if !p.used[id] {
			p.used[id] = true
			return UIDBase + id
		}
	}
	return nobody // every uid busy: share, rather than refuse
}

func (p *uidPool) put(uid uint32) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.used, uid-UIDBase)
}
