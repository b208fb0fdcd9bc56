package auth

import (
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// A users file keeps no secret, only what checks one: a string that says
// how it was made, so that the rule can change without a flag day.
//
//	pbkdf2-sha256$<iterations>$<salt>$<hash>   salt and hash in unpadded standard base64
//	sha256$<hex>                               for random tokens of 128 bits or more only
//
// PBKDF2 makes guessing a person's password slow; a random token has too
// much entropy to guess, so one SHA-256 is enough and lets Token find its
// user by the hash alone.

const (
	// DefaultIterations is the PBKDF2-SHA256 work factor HashSecret uses:
	// OWASP's 2023 advice. Checking one password costs tens of
	// milliseconds; a node remembers secrets it has verified, so only a
	// connection's first AUTH (or a guesser) pays it.
	DefaultIterations = 600_000
	// MinIterations is the fewest a users file may ask for.
	MinIterations = 1000
	// MinTokenLength is the shortest secret HashToken and the cluster
	// token accept: 32 characters, over 128 bits when random.
	MinTokenLength = 32

	pbkdf2Prefix = "pbkdf2-sha256$"
	sha256Prefix = "sha256$"
	saltLen      = 16
	keyLen       = 32
)

// hashed is one parsed secret hash.
type hashed struct {
	iter int    // 0 for sha256$
	salt []byte // nil for sha256$
	sum  []byte
}

// HashSecret returns the users file's string for a password: PBKDF2-SHA256
// with a fresh random salt and iterations rounds (0 means
// DefaultIterations).
func HashSecret(secret string, iterations int) (string, error) {
	if iterations == 0 {
		iterations = DefaultIterations
	}
	if iterations < MinIterations {
		return "", fmt.Errorf("auth: %d iterations, want at least %d", iterations, MinIterations)
	}
	if secret == "" {
		return "", errors.New("auth: the secret is empty")
	}
	salt := make([]byte, saltLen)
	rand.Read(salt)
	sum, err := pbkdf2.Key(sha256.New, secret, salt, iterations, keyLen)
	if err != nil {
		return "", fmt.Errorf("auth: hash: %w", err)
	}
	b64 := base64.RawStdEncoding
	return pbkdf2Prefix + strconv.Itoa(iterations) + "$" + b64.EncodeToString(salt) + "$" + b64.EncodeToString(sum), nil
}

// HashToken returns the users file's string for a random token, which
// Token can then find: sha256$<hex>. The token must be at least
// MinTokenLength characters.
func HashToken(token string) (string, error) {
	if len(token) < MinTokenLength {
		return "", fmt.Errorf("auth: a token of %d characters is too short to hash with sha256$ (want at least %d random ones; use HashSecret for a password)", len(token), MinTokenLength)
	}
	sum := sha256.Sum256([]byte(token))
	return sha256Prefix + hex.EncodeToString(sum[:]), nil
}

// parseHash reads a secret's hash; its errors never quote the string.
func parseHash(s string) (hashed, error) {
	switch {
	case strings.HasPrefix(s, sha256Prefix):
		sum, err := hex.DecodeString(s[len(sha256Prefix):])
		if err != nil || len(sum) != sha256.Size {
			return hashed{}, errors.New("sha256$ wants 64 hex digits after the $")
		}
		return hashed{sum: sum}, nil
	case strings.HasPrefix(s, pbkdf2Prefix):
		parts := strings.Split(s[len(pbkdf2Prefix):], "$")
		if len(parts) != 3 {
			return hashed{}, errors.New("pbkdf2-sha256 wants pbkdf2-sha256$<iterations>$<salt>$<hash>")
		}
		iter, err := strconv.Atoi(parts[0])
		if err != nil || iter < MinIterations || iter > 100_000_000 {
			return hashed{}, fmt.Errorf("pbkdf2-sha256 iterations must be a number from %d to 100000000", MinIterations)
		}
		b64 := base64.RawStdEncoding
		salt, err := b64.DecodeString(parts[1])
		if err != nil || len(salt) < 8 {
			return hashed{}, errors.New("pbkdf2-sha256 salt must be unpadded base64 of at least 8 bytes")
		}
		sum, err := b64.DecodeString(parts[2])
		if err != nil || len(sum) < 16 || len(sum) > 64 {
			return hashed{}, errors.New("pbkdf2-sha256 hash must be unpadded base64 of 16 to 64 bytes")
		}
		return hashed{iter: iter, salt: salt, sum: sum}, nil
	case s == "":
		return hashed{}, errors.New("no secret: want a string from `kvstrata hash-secret`")
	default:
		return hashed{}, errors.New("unknown hash format: want pbkdf2-sha256$… or sha256$… (from `kvstrata hash-secret`), never the secret itself")
	}
}

// check reports whether secret matches h, comparing in constant time.
func (h hashed) check(secret string) bool {
	var got []byte
	if h.iter == 0 {
		s := sha256.Sum256([]byte(secret))
		got = s[:]
	} else {
		var err error
		got, err = pbkdf2.Key(sha256.New, secret, h.salt, h.iter, len(h.sum))
		if err != nil {
			return false
		}
	}
	return subtle.ConstantTimeCompare(got, h.sum) == 1
}

func sumOf(s string) [sha256.Size]byte { return sha256.Sum256([]byte(s)) }

func equal(a, b []byte) bool { return subtle.ConstantTimeCompare(a, b) == 1 }
