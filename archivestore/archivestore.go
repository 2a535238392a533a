// Package archivestore is where the audit archive's objects are kept (cold
// storage, docs/audit.md): a NATS object store bucket by default, or any
// S3-compatible store. Every access to either goes through here.
package archivestore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/subjects"
)

// Object is one stored object: its name and size in bytes.
type Object struct {
	Name string
	Size int64
}

// Store keeps named objects. An object, once put, is never replaced.
type Store interface {
	// Put stores r's size bytes as name.
	Put(ctx context.Context, name string, r io.Reader, size int64) error
	// Get reads name back whole; ErrNotFound when there is none.
	Get(ctx context.Context, name string) ([]byte, error)
	// List returns every object, by name.
	List(ctx context.Context) ([]Object, error)
	// String says where the store is, for messages (no credentials).
	String() string
}

// ErrNotFound is Get's error for a name not stored.
var ErrNotFound = errors.New("no such archive object")

// ErrExists is Put's error for a name already stored.
var ErrExists = errors.New("archive object exists")

// MaxObject bounds what Get reads of one object.
const MaxObject = 1 << 30

// Location is where an archive is: "" or nats:// (the default bucket, or
// nats://BUCKET), or s3://BUCKET/PREFIX. For S3 the endpoint is the URL's
// endpoint parameter (s3://b/p?endpoint=http://host:port), else
// AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL, else Amazon's; the region is
// AWS_REGION (or region=); credentials are the usual AWS environment
// variables, then the shared credentials file (AWS_PROFILE).
type Location struct {
	// Kind is "nats" or "s3".
	Kind string
	// Bucket is the object store bucket or the S3 bucket.
	Bucket string
	// Prefix is the S3 key prefix (ends with "/" unless empty).
	Prefix   string
	Endpoint string
	Region   string
}

// ParseLocation parses an archive URL; defaultBucket is the NATS bucket
// "" and "nats://" name.
func ParseLocation(s, defaultBucket string) (Location, error) {
	if s == "" {
		return Location{Kind: "nats", Bucket: defaultBucket}, nil
	}
	u, err := url.Parse(s)
	if err != nil {
		return Location{}, err
	}
	switch u.Scheme {
	case "nats":
		b := u.Host
		if b == "" {
			b = defaultBucket
		}
		return Location{Kind: "nats", Bucket: b}, nil
	case "s3":
		if u.Host == "" {
			return Location{}, fmt.Errorf("%s: no bucket (s3://BUCKET/PREFIX)", s)
		}
		l := Location{Kind: "s3", Bucket: u.Host, Prefix: strings.Trim(u.Path, "/")}
		if l.Prefix != "" {
			l.Prefix += "/"
		}
		q := u.Query()
		l.Endpoint = firstOf(q.Get("endpoint"), os.Getenv("AWS_ENDPOINT_URL_S3"), os.Getenv("AWS_ENDPOINT_URL"), "https://s3.amazonaws.com")
		l.Region = firstOf(q.Get("region"), os.Getenv("AWS_REGION"), os.Getenv("AWS_DEFAULT_REGION"))
		return l, nil
	}
	return Location{}, fmt.Errorf("%s: an archive is nats://[BUCKET] or s3://BUCKET/PREFIX", s)
}

func firstOf(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}

// Open is the store at url (ParseLocation; "" is the default bucket on js).
func Open(js jetstream.JetStream, url string) (Store, error) {
	loc, err := ParseLocation(url, subjects.BucketAuditArchive)
	if err != nil {
		return nil, err
	}
	if loc.Kind == "s3" {
		return NewS3(loc)
	}
	return NewNATS(js, loc.Bucket), nil
}
