package archivestore

import (
	"context"
	"fmt"
	"io"
	"net/url"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// S3 is an archive in an S3-compatible store.
type S3 struct {
	c   *minio.Client
	loc Location
}

// NewS3 connects to loc (Kind "s3"). Credentials come from
// AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (AWS_SESSION_TOKEN), then the
// shared credentials file, then an instance's IAM role.
func NewS3(loc Location) (*S3, error) {
	u, err := url.Parse(loc.Endpoint)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("S3 endpoint %q: want http(s)://host[:port]", loc.Endpoint)
	}
	creds := credentials.NewChainCredentials([]credentials.Provider{
		&credentials.EnvAWS{}, &credentials.FileAWSCredentials{}, &credentials.IAM{},
	})
	c, err := minio.New(u.Host, &minio.Options{Creds: creds, Secure: u.Scheme == "https", Region: loc.Region,
		BucketLookup: minio.BucketLookupPath})
	if err != nil {
		return nil, err
	}
	return &S3{c: c, loc: loc}, nil
}

func (s *S3) String() string { return "s3://" + s.loc.Bucket + "/" + s.loc.Prefix }

// Put implements Store.
func (s *S3) Put(ctx context.Context, name string, r io.Reader, size int64) error {
	if _, err := s.c.StatObject(ctx, s.loc.Bucket, s.loc.Prefix+name, minio.StatObjectOptions{}); err == nil {
		return fmt.Errorf("%s: %w", name, ErrExists)
	} else if minio.ToErrorResponse(err).Code != minio.NoSuchKey {
		return err
	}
	_, err := s.c.PutObject(ctx, s.loc.Bucket, s.loc.Prefix+name, r, size,
		minio.PutObjectOptions{ContentType: "application/jsonl", SendContentMd5: true})
	return err
}

// Get implements Store.
func (s *S3) Get(ctx context.Context, name string) ([]byte, error) {
	o, err := s.c.GetObject(ctx, s.loc.Bucket, s.loc.Prefix+name, minio.GetObjectOptions{})
	if err != nil {
		return nil, err
	}
	defer o.Close()
	b, err := io.ReadAll(io.LimitReader(o, MaxObject+1))
	if minio.ToErrorResponse(err).Code == minio.NoSuchKey {
		return nil, fmt.Errorf("%s: %w", name, ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	if len(b) > MaxObject {
		return nil, fmt.Errorf("%s: larger than %d bytes", name, MaxObject)
	}
	return b, nil
}

// List implements Store.
func (s *S3) List(ctx context.Context) ([]Object, error) {
	var out []Object
	for o := range s.c.ListObjects(ctx, s.loc.Bucket, minio.ListObjectsOptions{Prefix: s.loc.Prefix, Recursive: true}) {
		if o.Err != nil {
			return nil, o.Err
		}
		out = append(out, Object{Name: o.Key[len(s.loc.Prefix):], Size: o.Size})
	}
	return out, nil
}

// EnsureBucket makes the bucket when it is missing (the tests' server
// starts empty; a real archive's bucket is usually made by its owner).
func (s *S3) EnsureBucket(ctx context.Context) error {
	ok, err := s.c.BucketExists(ctx, s.loc.Bucket)
	if err != nil || ok {
		return err
	}
	err = s.c.MakeBucket(ctx, s.loc.Bucket, minio.MakeBucketOptions{Region: s.loc.Region})
	if minio.ToErrorResponse(err).Code == minio.BucketAlreadyOwnedByYou {
		return nil
	}
	return err
}
