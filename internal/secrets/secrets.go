// Package secrets resolves the credentials tools receive, by name, from a
// directory of files and from the environment. Values never leave the
// executor except in the requests that need them.
package secrets

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"regexp"
	"strings"
)

// EnvPrefix starts the environment variable holding a secret: the secret
// api.token is read from TOOLGATE_SECRET_API_TOKEN.
const EnvPrefix = "TOOLGATE_SECRET_"

// MaxBytes bounds a secret file: a secret is a token or key, never a
// document, and a larger file is a misconfiguration.
const MaxBytes = 64 << 10

var (
	// ErrNotFound: no file and no environment variable holds the secret.
	ErrNotFound = errors.New("secret not found")
	// ErrInvalidName: the name could escape the directory or is not one a
	// manifest can declare.
	ErrInvalidName = errors.New("invalid secret name")
	// ErrUnreachable: the secret is in no environment variable and the
	// secrets directory cannot be opened (gone, not a directory, not
	// readable), so whether it holds the secret is unknown.
	ErrUnreachable = errors.New("secret source unreachable")
)

// A name starts with a letter or digit and holds only letters, digits, '.',
// '_' and '-': no separators, so "..", "a/b" and absolute paths are refused
// before any file is opened.
var validName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// Source resolves secrets: first the file Dir/<name>, then the environment
// variable EnvPrefix + <NAME> (upper case, '.' and '-' as '_'). The zero
// Source reads the environment only.
type Source struct {
	// Dir holds one file per secret; empty disables files. Files are read
	// through os.Root, so a symbolic link leading outside Dir is refused.
	Dir string
	// LookupEnv reads the environment; nil means os.LookupEnv.
	LookupEnv func(string) (string, bool)
}

// ValidName reports whether name may name a secret.
func ValidName(name string) bool { return validName.MatchString(name) }

// EnvName is the environment variable consulted for name.
func EnvName(name string) string {
	return EnvPrefix + strings.NewReplacer(".", "_", "-", "_").Replace(strings.ToUpper(name))
}

// Lookup returns the value of the named secret. A file's trailing line
// break is dropped (editors and `echo` add one). An empty value counts as
// missing: it can authenticate nothing and could not be scrubbed from output.
func (s *Source) Lookup(name string) (string, error) {
	if !ValidName(name) {
		return "", fmt.Errorf("%w: %q", ErrInvalidName, name)
	}
	var dirErr error
	if s.Dir != "" {
		root, err := os.OpenRoot(s.Dir)
		if err != nil {
			// The environment may still hold it.
			dirErr = err
		} else {
			v, err := readFile(root, name)
			root.Close()
			switch {
			case err == nil && v != "":
				return v, nil
			case err != nil && !errors.Is(err, fs.ErrNotExist):
				return "", fmt.Errorf("secret %s: %w", name, err)
			}
		}
	}
	lookup := s.LookupEnv
	if lookup == nil {
		lookup = os.LookupEnv
	}
	if v, ok := lookup(EnvName(name)); ok && v != "" {
		return v, nil
	}
	if dirErr != nil {
		return "", fmt.Errorf("%w: secret %s: %w", ErrUnreachable, name, dirErr)
	}
	return "", fmt.Errorf("%w: %s", ErrNotFound, name)
}

func readFile(root *os.Root, name string) (string, error) {
	f, err := root.Open(name)
	if err != nil {
		return "", err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return "", err
	}
	if !st.Mode().IsRegular() {
		return "", fmt.Errorf("not a regular file")
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxBytes+1))
	if err != nil {
		return "", err
	}
	if len(b) > MaxBytes {
		return "", fmt.Errorf("file exceeds %d bytes", MaxBytes)
	}
	return strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r"), nil
}
