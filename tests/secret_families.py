"""Issue 35's secret families (points 1 and 9): each a realistic text with a fake secret, and the values that must be gone.

Values are built from pieces so that this file holds no string a secret scanner would flag. Imported by
tests/test_redaction.py and benchmarks/redaction.py, which also place each text in a tool result, a tool input and user text.
"""
A40 = "wJalrXUtnFEMI" + "/K7MDENG/bPxRfi" + "CYzEXAMPLE9Q"       # 40 characters, an AWS secret's shape
AKID = "AKIA" + "Z3XMPL7Q2WLM4TRB"
T36 = "q7Rw2Lm9" + "Xc4Vb8Nz" + "K3pT6yHd" + "5Fs1Jg0A" + "uE2i"     # 36 random token characters
T24 = T36[:24]
ANT = "sk-ant-" + "api03-" + "Zq8Wm3Rt" + "Yx2Vn7Lp" * 11 + "Kc5J-AA"   # 108 characters
GHP = "ghp_" + T36

# (family, text, values that must not survive)
FAMILIES = [
    # point 1
    ("aws console credentials.csv", "User name,Password,Access key ID,Secret access key,Console login link\n"
     f"ci-deploy,,{AKID},{A40},https://123456789012.signin.aws.amazon.com/console\n", [AKID, A40]),
    ("aws access keys csv", f"Access key ID,Secret access key\n{AKID},{A40}\n", [AKID, A40]),
    ("url password with @", "DATABASE_URL=postgres://admin:" + "p@ss" + "w0rd@9x" + "@db.example.com:5432/app", ["p@ssw0rd@9x", "w0rd@9x", "p@ss"]),
    ("git url password with @", "git clone https://bob:" + "Hunt3r@" + "2pw" + "@git.example.com/team/repo.git", ["Hunt3r@2pw", "2pw@"]),
    ("mysql -p<password>", "mysql -u root -p" + "Zq9vL2wx" + " -h 127.0.0.1 shop", ["Zq9vL2wx"]),
    ("mysqldump -p<password>", "mysqldump -uroot -p'" + "S3cr3t!pw" + "' shop > dump.sql", ["S3cr3t!pw"]),
    ("curl -u user:password", "curl -u admin:" + "Tr0ub4dor3x" + " https://ci.example.com/api/json", ["Tr0ub4dor3x"]),
    ("curl --user", "curl --user 'deploy:" + "n0t-a-r3al-pw" + "' -X POST https://api.example.com", ["n0t-a-r3al-pw"]),
    ("anthropic key wrapped", "export ANTHROPIC_API_KEY=" + ANT[:60] + "\n" + ANT[60:] + "\n", [ANT[:60], ANT[60:]]),
    ("anthropic key wrapped, bare", "Your key:\n  " + ANT[:70] + "\n  " + ANT[70:] + "\nKeep it safe.", [ANT[:70], ANT[70:]]),
    ("github token wrapped", "token: " + GHP[:22] + "\n" + GHP[22:] + "\n", [GHP[:22], GHP[22:]]),
    ("passphrase with spaces", 'GPG_PASSPHRASE="' + "correct horse " + "battery staple" + '"', ["correct horse battery staple", "battery staple"]),
    ("passphrase yaml with spaces", "signing:\n  passphrase: " + "purple monkey " + "dishwasher 42" + "\n", ["purple monkey dishwasher 42", "dishwasher"]),
    ("ssh-keygen -N passphrase", "ssh-keygen -t ed25519 -N '" + "my very " + "long phrase" + "' -f ~/.ssh/id", ["my very long phrase"]),
    # point 2: the assistant's own commands
    ("PGPASSWORD= command", "PGPASSWORD=" + "Qx7pL2mv" + " psql -h db -U app -c 'select 1'", ["Qx7pL2mv"]),
    ("MYSQL_PWD= command", "MYSQL_PWD=" + "Zq9vL2wx" + " mysql -u root shop", ["Zq9vL2wx"]),
    ("SSHPASS= command", "SSHPASS='" + "r00t-Pa55" + "' sshpass -e ssh root@10.0.0.5", ["r00t-Pa55"]),
    ("API_TOKEN= command", "API_TOKEN=" + "f3a9c1e7b2" + "d4 ./deploy.sh --prod", ["f3a9c1e7b2d4"]),
    ("sshpass -p", "sshpass -p '" + "r00t-Pa55" + "' ssh -o StrictHostKeyChecking=no root@10.0.0.5", ["r00t-Pa55"]),
    ("redis-cli -a", "redis-cli -h cache -a " + "Rds-s3cret-77" + " ping", ["Rds-s3cret-77"]),
    ("mongosh -p", "mongosh mongodb://db:27017 -u admin -p " + "M0ng0-pw-42" + " --authenticationDatabase admin", ["M0ng0-pw-42"]),
    ("sqlcmd -P", "sqlcmd -S db -U sa -P '" + "Sql-Pa55w0rd" + "' -Q 'SELECT 1'", ["Sql-Pa55w0rd"]),
    ("az login -p", "az login --service-principal -u http://ci -p " + "Az~8Q~" + "p0rT4l-s3cret" + " --tenant t", ["Az~8Q~p0rT4l-s3cret"]),
    ("wget --http-password", "wget --http-user=bob --http-password=" + "W9et-pw-11" + " https://x.example.com/f", ["W9et-pw-11"]),
    ("plink -pw", "plink -ssh admin@host -pw " + "Pl1nk-pw-9" + " uptime", ["Pl1nk-pw-9"]),
    ("smbclient user%password", "smbclient //fs/share -U alice%" + "Smb-pw-2024" + " -c ls", ["Smb-pw-2024"]),
    ("token into --password-stdin", "echo '" + "Dkr-s3cret-881" + "' | docker login -u ci --password-stdin registry.example.com", ["Dkr-s3cret-881"]),
    ("printf into --password-stdin", 'printf "%s" "' + "Hlm-s3cret-73" + '" | helm registry login ghcr.io -u ci --password-stdin', ["Hlm-s3cret-73"]),
    # point 2: tokens with a fixed, documented prefix
    ("vault token", "VAULT_TOKEN=hvs." + "CAESI" + T36 + "x9" + " vault kv get secret/app", ["hvs.CAESI" + T36]),
    ("vault token bare", "Token: hvs." + T24 + "\nPolicies: root", ["hvs." + T24]),
    ("shopify access token", "X-Shopify-Access-Token: shpat_" + "9f8e7d6c5b4a3f2e" + "1d0c9b8a7f6e5d4c", ["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"]),
    ("square access token", "sq0atp-" + "Zq8Wm3RtYx2Vn7Lp" + "Kc5Jq1", ["sq0atp-Zq8Wm3RtYx2Vn7LpKc5Jq1"]),
    ("linear api key", "LINEAR=lin_api_" + T36 + "Zq8Wm", ["lin_api_" + T36]),
    ("atlassian api token", "jira token ATATT3x" + "FfGF0" + T36 + T36[:20] + "=A1B2C3D4", ["ATATT3xFfGF0" + T36]),
    ("notion token", "notion = Client(auth='ntn_" + "4159" + T36[:8] + T36 + "')", ["ntn_4159" + T36[:8]]),
    ("notion secret_", "NOTION_KEY: secret_" + T36 + "AbCdEfG", ["secret_" + T36]),
    ("telegram bot token", "https://api.telegram.org/bot" + "7123456789:AA" + "Hk3Rq" + T24 + "wXy0" + "/getMe", ["7123456789:AAHk3Rq" + T24]),
    ("telegram bot token bare", "bot = Bot('" + "6012345678:AA" + "Ff9Zq" + T24 + "Ab1c" + "')", ["6012345678:AAFf9Zq" + T24]),
    ("discord webhook", "https://discord.com/api/webhooks/" + "112233445566778899" + "/" + T36 + "Qw-_" + T24, [T36 + "Qw-_"]),
    ("teams webhook", "https://acme.webhook.office.com/webhookb2/" + "0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b@aa11bb22-cc33-dd44-ee55-ff6677889900"
     + "/IncomingWebhook/" + "9a8b7c6d5e4f30112233445566778899" + "/1a2b3c4d-5e6f-7081-92a3-b4c5d6e7f809", ["9a8b7c6d5e4f30112233445566778899"]),
    ("discord bot token", "DISCORD_TOKEN=" + "MTA5ODc2NTQzMjEwOTg3NjU0Mw" + ".GhJkLm." + T36[:27] + "x9Zq8Wm3RtYx", ["MTA5ODc2NTQzMjEwOTg3NjU0Mw.GhJkLm"]),
    # point 2: private keys other than PEM
    ("openssh private key", "-----BEGIN OPENSSH " + "PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\n"
     "QyNTUxOQAAACDx" + T36 + "\n-----END OPENSSH " + "PRIVATE KEY-----\n", [T36]),
    ("putty ppk", "PuTTY-User-Key-File-3: ssh-ed25519\nEncryption: none\nComment: ci\nPublic-Lines: 2\nAAAAC3NzaC1lZDI1NTE5AAAAIB" + T24
     + "\nPrivate-Lines: 1\nAAAAIF" + T36 + "Zq8W\nPrivate-MAC: 9f8e7d6c5b4a3f2e1d0c9b8a7f6e5d4c9f8e7d6c5b4a3f2e1d0c9b8a7f6e5d4c\n", ["AAAAIF" + T36]),
    ("age secret key", "# created: 2024-01-01\n# public key: age1" + "qz8wm3rtyx2vn7lpkc5jq1" + "\nAGE-SECRET-KEY-1" + "QZ8WM3RTYX2VN7LPKC5JQ1" * 2 + "QZ8WM3RTYX2VN7" + "\n",
     ["AGE-SECRET-KEY-1QZ8WM3RTYX2VN7LPKC5JQ1"]),
    ("jwk private key", '{"kty": "EC", "crv": "P-256", "x": "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU", "y": "x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0", "d": "'
     + "jpsQnnGQmL-YBIffH1136cLV" + "_Z9IIM6Q7AOy7ICwAvwQ" + '"}', ["jpsQnnGQmL-YBIffH1136cLV_Z9IIM6Q7AOy7ICwAvwQ"]),
    ("gpg armored private key", "-----BEGIN PGP " + "PRIVATE KEY BLOCK-----\n\nlQOYBGX" + T36 + "\n=Ab12\n-----END PGP " + "PRIVATE KEY BLOCK-----", [T36]),
    ("ppk v2 wrapped in JSON", '{"stdout": "PuTTY-User-Key-File-2: ssh-rsa\\nPrivate-Lines: 1\\nAAAAgQ' + T36 + '\\nPrivate-MAC: 0a1b"}', [T36]),
]
