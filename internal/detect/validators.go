package detect

import (
	"math/big"
	"regexp"
	"strconv"
	"strings"
)

var validators = map[string]func(string) bool{
	"luhn":  luhn,
	"iban":  iban,
	"ssn":   ssn,
	"phone": phone,
	// Added with the national identifiers; see below.
	"card":              card,
	"nino":              nino,
	"es_dni":            esDNI,
	"nl_bsn":            nlBSN,
	"pl_pesel":          plPESEL,
	"br_cpf":            brCPF,
	"fr_nir":            frNIR,
	"in_aadhaar":        inAadhaar,
	"it_codice_fiscale": itCodiceFiscale,
	"se_personnummer":   sePersonnummer,
	"ca_sin":            caSIN,
	"phone_national":    phoneNational,
	"entropy":           entropy,
	"assigned_value":    assignedValue,
	"mrz":               mrz,
	"cn_resident_id":    cnResidentID,
	"de_tax_id":         deTaxID,
	"google_api_key":    googleAPIKey,
	"ai_key":            aiKey,
	"slack":             slack,
	"pem_block":         pemBlock,
	"not_filler":        notFiller,
	"env_value":         envValue,
}

func digits(s string) string {
	var b strings.Builder
	for _, c := range s {
		if c >= '0' && c <= '9' {
			b.WriteRune(c)
		}
	}
	return b.String()
}

// luhn accepts 13 to 19 digits passing the Luhn checksum.
func luhn(s string) bool {
	d := digits(s)
	if len(d) < 13 || len(d) > 19 {
		return false
	}
	sum := 0
	for i := range len(d) {
		n := int(d[len(d)-1-i] - '0')
		if i%2 == 1 {
			if n *= 2; n > 9 {
				n -= 9
			}
		}
		sum += n
	}
	return sum%10 == 0
}

// iban checks the ISO 13616 mod-97 checksum.
func iban(s string) bool {
	s = strings.ToUpper(strings.NewReplacer(" ", "", "-", "").Replace(s))
	if i := strings.LastIndexAny(s, ":#"); i >= 0 {
		s = s[i+1:]
	}
	s = strings.TrimPrefix(s, "IBAN")
	if len(s) < 15 || len(s) > 34 {
		return false
	}
	r := s[4:] + s[:4]
	var b strings.Builder
	for _, c := range r {
		switch {
		case c >= '0' && c <= '9':
			b.WriteRune(c)
		case c >= 'A' && c <= 'Z':
			b.WriteString(big.NewInt(int64(c - 'A' + 10)).String())
		default:
			return false
		}
	}
	n, ok := new(big.Int).SetString(b.String(), 10)
	return ok && new(big.Int).Mod(n, big.NewInt(97)).Int64() == 1
}

// ssn rejects area numbers that are never issued (000, 666, 9xx) and zero groups.
func ssn(s string) bool {
	d := digits(s)
	if len(d) != 9 {
		return false
	}
	area, group, serial := d[:3], d[3:5], d[5:]
	return area != "000" && area != "666" && area[0] != '9' && group != "00" && serial != "0000"
}

// phone wants 8 to 15 digits (E.164).
func phone(s string) bool {
	n := len(digits(s))
	return n >= 8 && n <= 15
}

// The validators below confirm national identity numbers by their check
// digits, as the recognisers of Microsoft Presidio do; a candidate that
// fails its checksum is not reported.

// card is luhn plus an issuer prefix: Visa 4, Mastercard 2 and 5, Amex,
// Diners and JCB 3, Discover and UnionPay 6. Nanosecond timestamps (1…),
// ISBNs and GTINs (0…, 9…) that happen to pass Luhn are not cards.
func card(s string) bool {
	// The first digit first: most candidates in long runs of digits fail
	// it, before any allocation.
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= '0' && c <= '9' {
			if c < '2' || c > '6' {
				return false
			}
			break
		}
	}
	d := digits(s)
	return luhn(d) && !allSame(d)
}

func allSame(d string) bool { return strings.Count(d, d[:1]) == len(d) }

// nino is a UK National Insurance number: two prefix letters (not BG, GB,
// KN, NK, NT, TN, ZZ), six digits, a suffix A-D.
func nino(s string) bool {
	t := strings.ToUpper(strings.ReplaceAll(s, " ", ""))
	if len(t) != 9 {
		return false
	}
	switch t[:2] {
	case "BG", "GB", "KN", "NK", "NT", "TN", "ZZ":
		return false
	}
	return true
}

// esDNI checks the letter of a Spanish DNI or NIE (mod 23).
func esDNI(s string) bool {
	t := strings.ToUpper(strings.NewReplacer("-", "", " ", "").Replace(s))
	if len(t) != 9 {
		return false
	}
	switch t[0] {
	case 'X':
		t = "0" + t[1:]
	case 'Y':
		t = "1" + t[1:]
	case 'Z':
		t = "2" + t[1:]
	}
	n, err := strconv.Atoi(t[:8])
	return err == nil && "TRWAGMYFPDXBNJZSQVHLCKE"[n%23] == t[8]
}

// nlBSN is the Dutch eleven-test.
func nlBSN(s string) bool {
	d := digits(s)
	if len(d) != 9 || d[0] == '0' && d[1] == '0' {
		return false
	}
	sum := 0
	for i := range 8 {
		sum += int(d[i]-'0') * (9 - i)
	}
	sum -= int(d[8] - '0')
	return sum%11 == 0 && !allSame(d)
}

// plPESEL checks the weighted check digit of a Polish PESEL.
func plPESEL(s string) bool {
	d := digits(s)
	if len(d) != 11 || allSame(d) {
		return false
	}
	w := []int{1, 3, 7, 9, 1, 3, 7, 9, 1, 3}
	sum := 0
	for i, x := range w {
		sum += int(d[i]-'0') * x
	}
	return (10-sum%10)%10 == int(d[10]-'0')
}

// brCPF checks both check digits of a Brazilian CPF.
func brCPF(s string) bool {
	d := digits(s)
	if len(d) != 11 || allSame(d) {
		return false
	}
	for k := 9; k <= 10; k++ {
		sum := 0
		for i := range k {
			sum += int(d[i]-'0') * (k + 1 - i)
		}
		if (sum*10)%11%10 != int(d[k]-'0') {
			return false
		}
	}
	return true
}

// frNIR checks the key of a French social security number: 97 minus the
// first 13 digits mod 97 (Corsica's 2A and 2B read as 19 and 18).
func frNIR(s string) bool {
	t := strings.ToUpper(strings.NewReplacer(" ", "", ".", "", "-", "").Replace(s))
	if len(t) != 15 {
		return false
	}
	body := t[:13]
	body = strings.Replace(body, "2A", "19", 1)
	body = strings.Replace(body, "2B", "18", 1)
	n, err := strconv.ParseInt(body, 10, 64)
	k, err2 := strconv.Atoi(t[13:])
	return err == nil && err2 == nil && int(97-n%97) == k
}

var verhoeffD = [10][10]int{{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, {1, 2, 3, 4, 0, 6, 7, 8, 9, 5}, {2, 3, 4, 0, 1, 7, 8, 9, 5, 6},
	{3, 4, 0, 1, 2, 8, 9, 5, 6, 7}, {4, 0, 1, 2, 3, 9, 5, 6, 7, 8}, {5, 9, 8, 7, 6, 0, 4, 3, 2, 1}, {6, 5, 9, 8, 7, 1, 0, 4, 3, 2},
	{7, 6, 5, 9, 8, 2, 1, 0, 4, 3}, {8, 7, 6, 5, 9, 3, 2, 1, 0, 4}, {9, 8, 7, 6, 5, 4, 3, 2, 1, 0}}
var verhoeffP = [8][10]int{{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, {1, 5, 7, 6, 2, 8, 3, 0, 9, 4}, {5, 8, 0, 3, 7, 9, 6, 1, 4, 2},
	{8, 9, 1, 6, 0, 4, 3, 5, 2, 7}, {9, 4, 5, 3, 1, 2, 6, 8, 7, 0}, {4, 2, 8, 6, 5, 7, 3, 9, 0, 1}, {2, 7, 9, 3, 8, 0, 6, 4, 1, 5},
	{7, 0, 4, 6, 9, 1, 3, 2, 5, 8}}

// inAadhaar checks the Verhoeff digit of an Indian Aadhaar number.
func inAadhaar(s string) bool {
	d := digits(s)
	if len(d) != 12 || d[0] < '2' || allSame(d) {
		return false
	}
	c := 0
	for i := range len(d) {
		c = verhoeffD[c][verhoeffP[i%8][int(d[len(d)-1-i]-'0')]]
	}
	return c == 0
}

// itCodiceFiscale checks the control letter of an Italian codice fiscale.
func itCodiceFiscale(s string) bool {
	t := strings.ToUpper(s)
	if len(t) != 16 {
		return false
	}
	odd := []int{1, 0, 5, 7, 9, 13, 15, 17, 19, 21, 2, 4, 18, 20, 11, 3, 6, 8, 12, 14, 16, 10, 22, 25, 24, 23}
	sum := 0
	for i := range 15 {
		c := t[i]
		v := 0
		switch {
		case c >= '0' && c <= '9':
			v = int(c - '0')
		case c >= 'A' && c <= 'Z':
			v = int(c - 'A')
		default:
			return false
		}
		if i%2 == 0 {
			sum += odd[v]
		} else {
			sum += v
		}
	}
	return t[15] == byte('A'+sum%26)
}

// sePersonnummer is Luhn over the last ten digits of a Swedish
// personnummer, whose month must be 01-12.
func sePersonnummer(s string) bool {
	d := digits(s)
	if len(d) == 12 {
		d = d[2:]
	}
	if len(d) != 10 || d[2:4] < "01" || d[2:4] > "12" {
		return false
	}
	return luhnAny(d)
}

// caSIN is a Canadian social insurance number: nine digits passing Luhn,
// not beginning with 0 or 8.
func caSIN(s string) bool {
	d := digits(s)
	return len(d) == 9 && d[0] != '0' && d[0] != '8' && luhnAny(d) && !allSame(d)
}

func luhnAny(d string) bool {
	sum := 0
	for i := range len(d) {
		n := int(d[len(d)-1-i] - '0')
		if i%2 == 1 {
			if n *= 2; n > 9 {
				n -= 9
			}
		}
		sum += n
	}
	return sum%10 == 0
}

// phoneNational wants 8 to 15 digits that are not a date.
func phoneNational(s string) bool {
	d := digits(s)
	if len(d) < 8 || len(d) > 15 || allSame(d) {
		return false
	}
	t := strings.TrimSpace(s)
	// A bare run of fewer than ten digits is more often a count, a build
	// or an order than a phone number; national numbers are written with
	// a leading 0, a +, or separators.
	plain := !strings.ContainsAny(t, " .-()+") && t[0] != '0'
	return !(plain && len(d) < 10) && !dateLike.MatchString(t) && !compactDate.MatchString(t)
}

var compactDate = regexp.MustCompile(`^(?:19|20)[0-9]{2}(?:0[1-9]|1[0-2])[0-3][0-9](?:[0-9]{2,6})?$`)

var dateLike = regexp.MustCompile(`^(?:19|20)[0-9]{2}[-./][0-9]{1,2}[-./][0-9]{1,2}$|^[0-9]{1,2}[-./][0-9]{1,2}[-./](?:19|20)?[0-9]{2}$`)

// entropy confirms a credential's value (what follows its name and '=' or
// ':', or the whole match) looks generated: letters and digits mixed, not
// prose, not a repeated character.
func entropy(s string) bool {
	v := strings.TrimRight(s, "\"' =")
	if i := strings.LastIndexAny(v, "=:"); i >= 0 && i < len(v)-1 {
		v = v[i+1:]
	}
	v = strings.Trim(v, "\"' ")
	return randomLooking(v, 8)
}

// assignedValue confirms the value at the end of an assignment, whatever
// the operator (`=`, `:`, `,` of a property call, `>` of an XML element),
// looks generated: letters and digits mixed, or a long run of digits.
func assignedValue(s string) bool {
	v := strings.TrimRight(s, "\"'\x60 ")
	if i := strings.LastIndexAny(v, " \t\n\"'\x60>,"); i >= 0 {
		v = v[i+1:]
	}
	// An unquoted name=value without blanks: the value follows the name.
	if i := strings.Index(asciiLower(v), "token"); i >= 0 {
		if j := strings.IndexAny(v[i:], "=:"); j >= 0 {
			v = strings.TrimLeft(v[i+j:], "=:")
		}
	}
	if artifact.MatchString(v) {
		return false
	}
	if d := digits(v); len(d) == len(v) && len(v) >= 16 {
		return !allSame(v)
	}
	return randomLooking(v, 8) || mixedCase(v, 12)
}

// artifact is a package's name and version (jjwt-jackson-0.11.2), as in a
// Maven coordinate io.jsonwebtoken:jjwt-jackson:0.11.2.
var artifact = regexp.MustCompile(`^[a-z][a-z0-9]*(?:[-_.][a-z][a-z0-9]*)*[-:@]v?[0-9]+(?:\.[0-9]+)+(?:[-.][a-z0-9]+)?$`)

// mixedCase reports whether s, of at least n bytes, mixes upper- and
// lower-case letters as generated text does (upper case a fifth of the
// letters or more), not as a camel-case name does.
func mixedCase(s string, n int) bool {
	if len(s) < n {
		return false
	}
	var upper, lower int
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= 'A' && c <= 'Z':
			upper++
		case c >= 'a' && c <= 'z':
			lower++
		}
	}
	return upper*5 >= upper+lower && lower*5 >= upper+lower && shannon(s) >= 3
}

// mrz checks the check digits of a passport's machine-readable second line
// (ICAO 9303, weights 7, 3, 1): document number, birth date, expiry and
// the composite.
func mrz(s string) bool {
	if len(s) != 44 {
		return false
	}
	check := func(field string, digit byte) bool {
		sum := 0
		for i := 0; i < len(field); i++ {
			v := 0
			switch c := field[i]; {
			case c >= '0' && c <= '9':
				v = int(c - '0')
			case c >= 'A' && c <= 'Z':
				v = int(c-'A') + 10
			}
			sum += v * [3]int{7, 3, 1}[i%3]
		}
		return digit == '<' && sum%10 == 0 || int(digit-'0') == sum%10
	}
	return check(s[0:9], s[9]) && check(s[13:19], s[19]) && check(s[21:27], s[27]) &&
		check(s[0:10]+s[13:20]+s[21:43], s[43])
}

// cnResidentID checks the ISO 7064 MOD 11-2 check character of a Chinese
// resident identity card number.
func cnResidentID(s string) bool {
	if len(s) != 18 {
		return false
	}
	sum := 0
	for i := range 17 {
		sum += int(s[i]-'0') * [17]int{7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2}[i]
	}
	return strings.ToUpper(s[17:]) == string("10X98765432"[sum%11])
}

// deTaxID checks the ISO 7064 MOD 11,10 digit of a German Steuer-ID.
func deTaxID(s string) bool {
	d := digits(s)
	if len(d) != 11 || d[0] == '0' || allSame(d) {
		return false
	}
	product := 10
	for i := range 10 {
		sum := (int(d[i]-'0') + product) % 10
		if sum == 0 {
			sum = 10
		}
		product = sum * 2 % 11
	}
	check := 11 - product
	if check == 10 {
		check = 0
	}
	return check == int(d[10]-'0')
}

// googleAPIKey wants AIza and 35 more characters, or a few more (a key
// mistyped or with a suffix), but not a run so long that AIza only begins a
// longer string (the pattern takes a run whole), and not one character
// repeated: gitleaks' entropy floor of 4 bits, less a margin.
func googleAPIKey(s string) bool {
	return len(s) >= 39 && len(s) <= 42 && shannon(s) >= 3.5
}

// aiKey confirms an OpenAI-style key by entropy. An Anthropic one (sk-ant-)
// of its exact shape (a version such as api03, 93 characters, the suffix
// AA) is a key; one of another length is taken only if it does not read as
// a made-up sequence (abc123xyz-456def…), as documentation's samples do.
func aiKey(s string) bool {
	if rest, ok := strings.CutPrefix(s, "sk-ant-"); ok && anthropicKey.MatchString(rest) {
		return true
	} else if ok && sequential(rest) {
		return false
	}
	return entropy(s)
}

// sequential reports whether a third or more of s's letters and digits
// stand in runs of three or more that count up (abc, 456): rare by chance
// (about one in a thousand places), common in made-up samples.
func sequential(s string) bool {
	fold := func(c byte) byte {
		if c >= 'A' && c <= 'Z' {
			return c + 'a' - 'A'
		}
		return c
	}
	inRuns, alnum, run := 0, 0, 1
	for i := 0; i < len(s); i++ {
		c := fold(s[i])
		if c >= 0x80 || !isWord(c) || c == '_' {
			run = 1
			continue
		}
		alnum++
		if i > 0 && c == fold(s[i-1])+1 && c != '0' && c != 'a' {
			run++
			if run == 3 {
				inRuns += 3
			} else if run > 3 {
				inRuns++
			}
		} else {
			run = 1
		}
	}
	return alnum > 0 && inRuns*3 >= alnum
}

var anthropicKey = regexp.MustCompile(`^[a-z]+[0-9]{2}-[A-Za-z0-9_-]{93}AA$`)

// slack confirms a Slack token by the structure of Slack's formats (as
// gitleaks' rules read them): two groups of 8 or more digits (bot and user
// tokens), one such group and a tail of 18 or more (legacy bot tokens),
// xoxa/xoxr with a tail of 8, xoxo/xoxs with three numeric groups, or a
// tail of 100 or more (configuration tokens). Short made-up ones
// (xoxb-abcdef-abcdef) and tokens whose secret part is masked, so that the
// match ends at a dash, are not tokens.
func slack(s string) bool {
	if strings.HasPrefix(s, "xapp-") {
		return true
	}
	if len(s) < 6 || strings.HasSuffix(s, "-") {
		return false
	}
	kind, parts := s[3], strings.Split(s[5:], "-")
	long, numeric := 0, 0
	for _, p := range parts {
		n := leadingDigits(p)
		if n >= 8 {
			long++
		}
		if n > 0 && n == len(p) {
			numeric++
		}
	}
	tail := parts[len(parts)-1]
	switch {
	case long >= 2:
		return true
	case long == 1 && len(tail) >= 18 && leadingDigits(tail) < len(tail):
		return true
	case (kind == 'a' || kind == 'r') && len(tail) >= 8:
		return true
	case (kind == 'o' || kind == 's') && numeric >= 3 && len(parts) >= 4:
		return true
	}
	return len(tail) >= 100
}

func leadingDigits(s string) int {
	n := 0
	for n < len(s) && s[n] >= '0' && s[n] <= '9' {
		n++
	}
	return n
}

// pemBlock confirms a private key block: one cut off before its END line
// is taken as it is, but a whole block must hold at least 32 characters of
// key; an empty or one-word body is an example.
func pemBlock(s string) bool {
	end := strings.LastIndex(s, "-----END ")
	if end < 0 {
		return true
	}
	body := s[strings.Index(s, "KEY")+3 : end]
	n := 0
	for i := 0; i < len(body); i++ {
		if c := body[i]; c == '+' || c == '/' || c == '=' || c < 0x80 && isWord(c) {
			n++
		}
	}
	return n >= 32
}

// notFiller confirms an assigned value (or a whole token) is not filler:
// one character making up half or more of 8 or more is a placeholder
// (glc_1111…, AIzaaaa…), not a generated secret.
func notFiller(s string) bool {
	v := assignedPart(s)
	if len(v) < 8 {
		return true
	}
	var n [256]int
	most := 0
	for i := 0; i < len(v); i++ {
		n[v[i]]++
		most = max(most, n[v[i]])
	}
	return most*2 < len(v)
}

// assignedPart is the value of name=value or name: value, quotes trimmed,
// or s when it holds no assignment.
func assignedPart(s string) string {
	v := strings.TrimRight(s, "\"' ")
	if i := strings.IndexAny(v, "=:"); i >= 0 && i < len(v)-1 {
		v = v[i+1:]
	}
	return strings.Trim(v, "\"' =:")
}

// envValue confirms the value of a credential-named variable: not filler,
// and, where the name says a key, token or secret (issued by a machine,
// so long), 16 characters or more; a password may be short.
func envValue(s string) bool {
	if !notFiller(s) {
		return false
	}
	i := strings.IndexAny(s, "=:")
	if i < 0 {
		return true
	}
	name := strings.ToUpper(s[:i])
	if strings.Contains(name, "PASS") || strings.Contains(name, "PWD") || strings.Contains(name, "CREDENTIAL") {
		return true
	}
	return len(assignedPart(s)) >= 16
}
