package envelope

import segjson "github.com/segmentio/encoding/json"

// Encode is the hand-off encoding of inv (runner.Handoff), written on
// every hop: JSON, by github.com/segmentio/encoding/json, in half the
// time of encoding/json. Its bytes differ from encoding/json's in one
// way a reader cannot tell: it writes the zero values of omitzero fields,
// which Decode (and encoding/json) read back as zero; FuzzEncode holds it
// to reading back as encoding/json's encoding does. Its own hashes and
// signatures (seal digests, principals) do not read these bytes.
func Encode(inv *Invocation) ([]byte, error) { return segjson.Marshal(inv) }
