// A real OpenID Connect provider on loopback for the dashboard's sign-in tests: panva's oidc-provider (an OpenID
// Certified implementation) with its development login form, where any login name signs in as that account.
//
//   node provider.mjs <port> <client_id> <client_secret> <redirect_uri>
//
// One confidential client (client_secret_basic, authorization code, PKCE required) redirecting to <redirect_uri>.
// An account's id is the login typed into the form; its email claim is that login, verified. Prints
// "listening <issuer>" once it accepts connections.
import Provider from 'oidc-provider';

const [port, clientId, clientSecret, redirectUri] = process.argv.slice(2);
if (!redirectUri) {
  console.error('usage: node provider.mjs <port> <client_id> <client_secret> <redirect_uri>');
  process.exit(2);
}
const issuer = `http://127.0.0.1:${port}`;

const provider = new Provider(issuer, {
  clients: [{
    client_id: clientId,
    client_secret: clientSecret,
    redirect_uris: [redirectUri],
    post_logout_redirect_uris: [redirectUri], // Streamlit's st.logout returns through the callback URL
    grant_types: ['authorization_code'],
    response_types: ['code'],
  }],
  claims: { openid: ['sub'], email: ['email', 'email_verified'], profile: ['name'] },
  // Streamlit reads the user from the ID token only (it never calls the userinfo endpoint): put the scopes'
  // claims there, as Google's and Microsoft's providers do.
  conformIdTokenClaims: false,
  pkce: { required: () => true },
  features: { devInteractions: { enabled: true } },
  cookies: { keys: ['eventide-test-only-cookie-key'] },
  async findAccount(ctx, id) {
    return {
      accountId: id,
      async claims() {
        return { sub: id, email: id, email_verified: true, name: id.split('@')[0] };
      },
    };
  },
});

const server = provider.listen(Number(port), '127.0.0.1', () => console.log(`listening ${issuer}`));
for (const signal of ['SIGTERM', 'SIGINT']) {
  process.on(signal, () => server.close(() => process.exit(0)));
}
