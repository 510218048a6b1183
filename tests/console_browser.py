"""The console's page in a real headless Chromium (Selenium), against a running console.

Usage: console_browser.py BASE_URL OUT_DIR
       console_browser.py --open BASE_URL OUT_DIR
With --open, BASE_URL is a console over a store without identities: the page must go straight to
the models list, asking for no token, and say the store is open; prints "browser: open store
checked".

Without it:
Signs in with the reader's token, opens the models list and a model's page, checks that a
description holding markup shows as text and that the reader is offered no promote or rollback
(and the API refuses the reader's promotion, 403); another caller -- an identity whose name is
markup -- promotes a version through the API and the page shows the move, with that name as text,
without a reload; opens a version's page (its load lines, lineage and tensors) and the comparison
of two versions. Then signs in as the team's writer, promotes a version and rolls the alias back
with the page's buttons, sees the alias timeline follow each, and opens the audit log. Finally a
wrong token is refused with the store's words. Screenshots of each page go to OUT_DIR. Exits
non-zero, saying why, on any failure or on any error in the browser's console.
"""

import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

MARKUP = '<img src=x onerror="document.title=\'pwned\'">'
# A description with no space to break at: the versions table must still fit the window.
LONG_DESCRIPTION = 'distilled-from-the-nightly-teacher-run-' * 12
# The name of an identity in the store's identities file (tests/console_test.cc), as the issue
# asks: if the page ever rendered it as markup, the alert would stop the test.
MARKUP_IDENTITY = '<img src=x onerror=alert(1)>'


def post(base, path, token, body):
    request = urllib.request.Request(
        base + path, data=json.dumps(body).encode(), method='POST',
        headers={'Authorization': 'Bearer ' + token, 'Content-Type': 'application/json'})
    with urllib.request.urlopen(request) as response:
        return json.loads(response.read())


def sign_in(driver, wait, token):
    wait.until(EC.presence_of_element_located((By.ID, 'token'))).send_keys(token)
    driver.find_element(By.CSS_SELECTOR, '#signin button[type=submit]').click()


def chrome():
    options = webdriver.ChromeOptions()
    for argument in ('--headless=new', '--no-sandbox', '--disable-dev-shm-usage',
                     '--window-size=1280,1600'):
        options.add_argument(argument)
    options.set_capability('goog:loggingPrefs', {'browser': 'ALL'})
    return webdriver.Chrome(service=Service('/usr/bin/chromedriver'), options=options)


def open_store(base, out):
    """A store that checks no tokens: no sign-in form, the models at once, the store called
    open, and nothing to sign out of."""
    driver = chrome()
    wait = WebDriverWait(driver, 20)
    try:
        driver.get(base + '/')
        wait.until(EC.text_to_be_present_in_element((By.ID, 'models'), 'open-net'))
        assert not driver.find_elements(By.ID, 'signin'), 'an open store asked for a token'
        who = driver.find_element(By.ID, 'who').text
        assert who.startswith('anonymous (admin)') and 'open store' in who, \
            f'the header says {who!r}'
        assert not driver.find_element(By.ID, 'signout').is_displayed(), 'a sign-out button'
        driver.save_screenshot(os.path.join(out, 'open-store.png'))
        errors = [entry for entry in driver.get_log('browser') if entry['level'] == 'SEVERE']
        assert not errors, f'errors in the browser console: {errors}'
        print('browser: open store checked')
    finally:
        driver.quit()


def main():
    if sys.argv[1] == '--open':
        os.makedirs(sys.argv[3], exist_ok=True)
        open_store(sys.argv[2], sys.argv[3])
        return
    base, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    # A description with markup, set through the API by the team's writer.
    post(base, '/api/v1/models/team-a-resnet/versions/1/annotations', 'team-a-token',
         {'description': MARKUP})
    # A better val_acc for version 2 (an offline evaluation), for the comparison.
    post(base, '/api/v1/models/team-a-resnet/versions/2/annotations', 'team-a-token',
         {'set_metrics': {'val_acc': 0.95}, 'reason': 'offline eval',
          'description': LONG_DESCRIPTION})

    driver = chrome()
    wait = WebDriverWait(driver, 20)
    try:
        driver.get(base + '/')
        sign_in(driver, wait, 'reader-token')
        wait.until(EC.text_to_be_present_in_element((By.ID, 'models'), 'team-a-resnet'))
        who = driver.find_element(By.ID, 'who').text
        assert who == 'serving (reader)', f'the header names the caller as {who!r}'
        driver.save_screenshot(os.path.join(out, 'models.png'))

        driver.find_element(By.LINK_TEXT, 'team-a-resnet').click()
        wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, '#versions tbody tr')))
        rows = driver.find_elements(By.CSS_SELECTOR, '#versions tbody tr')
        assert len(rows) == 2, f'{len(rows)} version rows, want 2'
        description = driver.find_element(
            By.CSS_SELECTOR, '#versions tr[data-version="1"] td.description').text
        assert description == MARKUP, f'the description shows as {description!r}'
        assert not driver.find_elements(By.CSS_SELECTOR, '#versions img'), 'markup was rendered'
        assert driver.title != 'pwned', 'a script from the description ran'
        # A long description is cut to its column (the whole of it on hover): the table fits.
        long_cell = driver.find_element(
            By.CSS_SELECTOR, '#versions tr[data-version="2"] td.description')
        assert long_cell.get_attribute('title') == LONG_DESCRIPTION, 'no whole value on hover'
        table_width = driver.execute_script(
            "return document.getElementById('versions').getBoundingClientRect().width")
        window_width = driver.execute_script('return window.innerWidth')
        assert table_width <= window_width, \
            f'the versions table is {table_width}px wide in a {window_width}px window'
        # The metric plot: one point per version that has the metric.
        points = driver.find_element(By.CSS_SELECTOR, '#plot polyline').get_attribute('points')
        assert len(points.split()) == 2, f'the val_acc plot has points {points!r}'
        # A reader is offered nothing to change, and the API refuses it anyway.
        assert driver.find_elements(By.ID, 'read-only'), 'no read-only note for the reader'
        assert not driver.find_elements(By.CSS_SELECTOR, 'button.promote, button.rollback'), \
            'the reader is offered promote or rollback'
        try:
            post(base, '/api/v1/models/team-a-resnet/promote', 'reader-token',
                 {'version': 1, 'alias': 'production'})
            raise AssertionError("the API accepted the reader's promotion")
        except urllib.error.HTTPError as refused:
            assert refused.code == 403, f'the reader\'s promotion got {refused.code}'
        driver.save_screenshot(os.path.join(out, 'model.png'))

        # Another caller (an identity named with markup) promotes; the open page follows without
        # a reload and shows the name as text.
        post(base, '/api/v1/models/team-a-resnet/promote', 'markup-token',
             {'version': 2, 'alias': 'production', 'reason': 'browser test'})
        wait.until(EC.text_to_be_present_in_element(
            (By.CSS_SELECTOR, '#versions tr[data-version="2"]'), 'production'))
        wait.until(EC.text_to_be_present_in_element((By.ID, 'timeline'), 'browser test'))
        timeline = driver.find_element(By.ID, 'timeline').text
        assert MARKUP_IDENTITY in timeline, f'the timeline does not name who moved it: {timeline!r}'
        assert not driver.find_elements(By.CSS_SELECTOR, '#timeline img'), 'markup was rendered'
        driver.save_screenshot(os.path.join(out, 'model-after-promotion.png'))

        # A version's page: how to load it, its tensors; then the change from version 1 to 2.
        driver.find_element(By.CSS_SELECTOR, '#versions tr[data-version="1"] td a').click()
        wait.until(EC.text_to_be_present_in_element((By.ID, 'tensors'), 'fc.weight'))
        load_lines = driver.find_element(By.ID, 'load-lines').text
        assert 'export team-a-resnet@1 model.safetensors' in load_lines, load_lines
        assert '--store=127.0.0.1:' in load_lines, load_lines
        graph = driver.find_element(By.ID, 'lineage-graph').text
        assert 'team-a-resnet-ft@1' in graph and 'fine tuned' in graph, f'the graph says {graph!r}'
        driver.save_screenshot(os.path.join(out, 'version.png'))
        driver.back()
        # Compare through the form (its default: the version before the latest with the latest).
        wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, '#compare-form button')))
        driver.find_element(By.CSS_SELECTOR, '#compare-form button').click()
        wait.until(EC.text_to_be_present_in_element((By.ID, 'changed'), 'fc.weight'))
        heading = driver.find_element(By.ID, 'compare-name').text
        assert heading == 'team-a-resnet@1 \u2192 team-a-resnet@2', heading
        # How its metrics compare with the version before.
        val_acc = driver.find_element(
            By.CSS_SELECTOR, '#metric-changes tr[data-metric="val_acc"]').text
        assert val_acc == 'val_acc 0.9000 0.9500 +0.05000', f'val_acc compares as {val_acc!r}'
        driver.save_screenshot(os.path.join(out, 'compare.png'))

        # The team's writer promotes version 1 and rolls the alias back with the page's buttons;
        # the alias timeline follows each.
        driver.find_element(By.ID, 'signout').click()
        sign_in(driver, wait, 'team-a-token')
        driver.get(base + '/#/models/team-a-resnet')
        wait.until(EC.presence_of_element_located(
            (By.CSS_SELECTOR, '#versions tr[data-version="1"] button.promote'))).click()
        alias = wait.until(EC.presence_of_element_located((By.ID, 'promote-form-alias')))
        assert alias.get_attribute('value') == 'production', alias.get_attribute('value')
        driver.find_element(By.ID, 'promote-form-reason').send_keys('promoted in the browser')
        driver.find_element(By.CSS_SELECTOR, '#promote-form button[type=submit]').click()
        wait.until(EC.text_to_be_present_in_element((By.ID, 'timeline'),
                                                    'promoted in the browser'))
        wait.until(EC.text_to_be_present_in_element(
            (By.CSS_SELECTOR, '#versions tr[data-version="1"]'), 'production'))
        assert 'team-a' in driver.find_element(By.ID, 'timeline').text
        driver.save_screenshot(os.path.join(out, 'promoted-in-browser.png'))
        wait.until(EC.presence_of_element_located(
            (By.CSS_SELECTOR, 'button.rollback[data-alias="production"]'))).click()
        wait.until(EC.presence_of_element_located((By.ID, 'rollback-form-reason'))).send_keys(
            'rolled back in the browser')
        driver.find_element(By.CSS_SELECTOR, '#rollback-form button[type=submit]').click()
        wait.until(EC.text_to_be_present_in_element((By.ID, 'timeline'),
                                                    'rolled back in the browser'))
        wait.until(EC.text_to_be_present_in_element(
            (By.CSS_SELECTOR, '#versions tr[data-version="2"]'), 'production'))
        driver.save_screenshot(os.path.join(out, 'rolled-back-in-browser.png'))

        # The audit log names every change with who made it.
        driver.find_element(By.ID, 'audit-link').click()
        wait.until(EC.text_to_be_present_in_element((By.ID, 'audit'), 'set_alias'))
        audit = driver.find_element(By.ID, 'audit').text
        assert 'team-a' in audit and MARKUP_IDENTITY in audit, f'the audit log says {audit!r}'
        assert not driver.find_elements(By.CSS_SELECTOR, '#audit img'), 'markup was rendered'
        driver.save_screenshot(os.path.join(out, 'audit.png'))

        errors = [entry for entry in driver.get_log('browser') if entry['level'] == 'SEVERE']
        assert not errors, f'errors in the browser console: {errors}'

        # A model name that is markup: the store refuses the name, the page says so as text.
        driver.get(base + '/#/models/' + urllib.parse.quote(MARKUP_IDENTITY))
        wait.until(EC.presence_of_element_located((By.ID, 'error')))
        assert not driver.find_elements(By.CSS_SELECTOR, 'main img'), 'markup was rendered'
        shown = driver.find_element(By.ID, 'error').text
        assert MARKUP_IDENTITY in shown, f'the refusal shows as {shown!r}'

        # A token the store does not know: the sign-in form again, with the store's words.
        driver.find_element(By.ID, 'signout').click()
        sign_in(driver, wait, 'wrong-token')
        wait.until(EC.presence_of_element_located((By.ID, 'signin-error')))
        driver.save_screenshot(os.path.join(out, 'refused.png'))
        print('browser: every page checked')
    finally:
        driver.quit()


if __name__ == '__main__':
    main()
