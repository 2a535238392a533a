package detect

import "testing"

// TestCredentialLookAlikes holds secrets' look-alikes that secret scanners
// publish as false positives (gitleaks' samples) beside the real shapes
// they resemble: the first must pass, the second must not.
func TestCredentialLookAlikes(t *testing.T) {
	e := Default()
	for _, c := range []struct{ benign, secret string }{
		// firebase-android-sdk's published example key, exactly; another key is a key.
		{"AIzaSyAnLA7NfeLquW1tJFpx_eQCxoX-oo6YyIs", "AIzaSyAnLA7NfeLquW1tJFpx_eQCxoX-oo6YyIt"},
		{`apiKey: "AIzaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"`, `apiKey: "AIzaSyNHxIf32IQ1a1yjl3ZJIqKZqzLAK1XhDk-"`},
		{"AIzaTesb6Tscfcni8vIpWZqNCXFDFslJtVSvFDqabcd123", "AIzaTesb6Tscfcni8vIpWZqNCXFDFslJtVSvFDq abcd123"},
		{"sk-ant-api03-abc123xyz-456de-klMnopqrstuvwx-3456yza789bcde-1234fghijklmnopAA", "sk-ant-api03-yS5SUkCnD8zRA9a9SkpXz9w3QlY7Zkuvqdt7s8Stqcbnr3yB"},
		{"xoxb-12345-abcd234", "xoxb-078666617603-1372159010928-g8xNbe3nNyjOq9wMxEhh2FDE"},
		{"xoxe.xoxp-1-SlackAppConfigurationAccessTokenHere", "xoxb-70153686174-1tm54WIKY4ZRQYM6LK5hhPNL"},
		{`"token4": "xoxp-572370529330-573807301142-572331691188-####################"`, `"token4": "xoxp-572370529330-573807301142-572331691188-b581d210a16f8e166b0629e8cbacbd2d"`},
		{"-----BEGIN PRIVATE KEY-----\nanything\n-----END PRIVATE KEY-----", "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7\n-----END PRIVATE KEY-----"},
		{"- (id)hf_requiredCharacteristicTypesForDisplayMetadata;", "Token saved: 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"},
		{`API_KEY="glc_111111111111111111111111111111111111111111="`, `API_KEY="glc_eyJvIjoiMTIzNDU2IiwibiI6InN0YWNrLTEyMzQ1Ni1pbnRlZ3JhdGlvbi1teS10b2tlbiIsImsiOiIxMjM0NTY3ODkwMTIzNDU2In0="`},
		{"SUMO_ACCESS_KEY: AbCeFG123", "SUMO_ACCESS_KEY: 9sV3kQw7ZpL2mN8xR4tY6uB1"},
		{"DB_PASSWORD=aaaaaaaaaaaa", "DB_PASSWORD=hunter2hunter"},
		{"fn::secret: ops_eyJzaWduSW5B..[Redacted]", "fn::secret: ops_eyJzaWduSW5BZGRyZXNzIjoiaHR0cHM6"},
		{`<input type="hidden" name="authenticity_token" value="7SWa-Fo1_hsC6oovfBsJFLGPUl2EhkSWPbJhWANwgaJWBDl1vxd9VNqXTNAefsJqzIRYaZEfYZLffa31rw8zJA" />`,
			`<input type="hidden" name="api_token" value="7SWa-Fo1_hsC6oovfBsJFLGPUl2EhkSWPbJhWANwgaJWBDl1vxd9VNqXTNAefsJqzIRYaZEfYZLffa31rw8zJA" />`},
		{`publicToken = "9Cnzj4p4WGeKLs1Pt8QuKUpRKfFLfRYC9AIKjbJTWit"`, `privateToken = "9Cnzj4p4WGeKLs1Pt8QuKUpRKfFLfRYC9AIKjbJTWit"`},
		{`notes = "Maven - io.jsonwebtoken:jjwt-jackson-0.11.2"`, `notes = "io.jsonwebtoken:Xk29fLq0Zw8rT3vB"`},
	} {
		if fs := e.Scan(c.benign, Secrets); len(fs) > 0 {
			t.Errorf("look-alike found: %q %v", c.benign, fs)
		}
		if fs := e.Scan(c.secret, Secrets); len(fs) == 0 {
			t.Errorf("secret missed: %q", c.secret)
		}
	}
}
