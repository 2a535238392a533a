package detect

import (
	"strconv"
	"strings"
)

// RuleOptionInjection is the rule id of OptionInjection's findings.
const RuleOptionInjection = "shell.option_injection"

// OptionInjection reports whether s, passed to a program as one argument,
// would be read as an option rather than an operand: it begins (after
// blanks) with "-" and something, and is not a number. A repository name of
// "--upload-pack=sleep 4;" makes git run a command without any shell
// metacharacter being interpreted, so argv templates alone do not stop it.
func OptionInjection(s string) bool {
	t := strings.TrimLeft(s, " \t")
	if len(t) < 2 || t[0] != '-' {
		return false
	}
	_, err := strconv.ParseFloat(t, 64)
	return err != nil
}
