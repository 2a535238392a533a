//go:build !race

package auditchain_test

const raceEnabled = false
